-- Change or read a counting semaphore's counter in one step, and publish a
-- wake-up when the change makes permits available and someone waits.
--
-- KEYS[1]  the counter (see counter_acquire.lua)
-- KEYS[2]  its waiters (see counter_acquire.lua)
-- KEYS[3]  the receipt of this call (see counter_prelude.lua): written by
--          the changes that took effect ('add', 'try_set', 'set', 'drain',
--          'delete' with status 1; a 'set' run again after others took
--          permits would give them back); 'read' writes none
-- ARGV[1]  owner token of the call (echoed; a wake-up's payload after '*')
-- ARGV[2]  the operation:
--            'add'      add ARGV[3] (negative: remove), creating the counter
--                       at 0 first (a release without a hold is an add)
--            'try_set'  create the counter at ARGV[3] unless it exists
--            'set'      set the counter to ARGV[3]
--            'drain'    take every available permit (none when the count is
--                       0 or below, which stays as it is)
--            'read'     nothing: the count and the waiters
--            'delete'   delete the counter (its waiters wait on)
-- ARGV[3]  the amount: a canonical decimal 64-bit integer ('0' for 'drain',
--          'read' and 'delete')
-- ARGV[4]  the wake-up channel
-- ARGV[5]  ms a receipt is kept; '0': none is written (a client that never
--          sends a call twice)
--
-- Returns {status, count, owner, waiters}
--   status 1  done: 'add', 'set': `count` is the new count; 'try_set': the
--             counter was created; 'drain': `count` is what was taken;
--             'read': the counter exists; 'delete': it existed
--          0  not done: 'try_set': the counter exists (`count` is it);
--             'drain': nothing available (`count` is the count, '0' when
--             it does not exist); 'read', 'delete': no counter ('0')
--          3  a name holds a value distlock did not write: nothing changed
--          4  'add' would leave the 64-bit range: nothing changed (`count`
--             is the count)
--          1  also when the receipt says this call took effect already:
--             `count` as it answered then; nothing changed
--   waiters   the registrations live after the call
local now = now_ms()
local count = read_counter(KEYS[1])
local waiting = live_waiters(KEYS[2], now)
local done = receipt(KEYS[3])
if count == nil or waiting == nil or done == nil then
  return {3, '0', ARGV[1], 0}
end
if done then
  return {1, done, ARGV[1], waiting}
end
local function took_effect(answer)
  keep_receipt(KEYS[3], answer, ARGV[5])
  return answer
end
local op = ARGV[2]
if op == 'read' then
  return {count and 1 or 0, count or '0', ARGV[1], waiting}
elseif op == 'add' then
  local added = redis.pcall('INCRBY', KEYS[1], ARGV[3])
  if type(added) == 'table' then
    return {4, count or '0', ARGV[1], waiting}
  end
  local after = took_effect(redis.call('GET', KEYS[1]))
  if string.sub(ARGV[3], 1, 1) ~= '-' then
    waiting = wake(ARGV[4], KEYS[2], after, now, ARGV[1])
  end
  return {1, after, ARGV[1], waiting}
elseif op == 'try_set' then
  if count then
    return {0, count, ARGV[1], waiting}
  end
  redis.call('SET', KEYS[1], ARGV[3])
  took_effect(ARGV[3])
  return {1, ARGV[3], ARGV[1], wake(ARGV[4], KEYS[2], ARGV[3], now, ARGV[1])}
elseif op == 'set' then
  redis.call('SET', KEYS[1], ARGV[3])
  took_effect(ARGV[3])
  return {1, ARGV[3], ARGV[1], wake(ARGV[4], KEYS[2], ARGV[3], now, ARGV[1])}
elseif op == 'drain' then
  if count and is_positive(count) then
    redis.call('SET', KEYS[1], '0')
    return {1, took_effect(count), ARGV[1], waiting}
  end
  return {0, count or '0', ARGV[1], waiting}
elseif op == 'delete' then
  if count then
    redis.call('DEL', KEYS[1])
    return {1, took_effect(count), ARGV[1], waiting}
  end
  return {0, '0', ARGV[1], waiting}
end
return redis.error_reply('counter_change.lua: unknown operation ' .. tostring(op))
