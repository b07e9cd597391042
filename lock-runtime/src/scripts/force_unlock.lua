-- Free a lock whoever holds it (an operator's force-unlock), and wake its waiters:
-- hand it to the first live waiter of its queue, or, with nobody queued, tell the
-- waiters that do not queue.
--
-- KEYS[1]  lock: "<owner><mark><token>:<since>:<holder>" (see acquire.lua)
-- KEYS[2]  fencing counter
-- KEYS[3]  queue (see queue_prelude.lua)
-- KEYS[4]  queue entries
-- KEYS[5]  this call's receipt: "1" or "0", what it answered, kept ARGV[6] ms
--          (none for '0'). A run that finds it answers the same and does
--          nothing: sent again after its reply was lost (a cluster client, a
--          Sentinel failover), a force-unlock would otherwise free the lock
--          it had just handed to the head of the queue, or one taken since.
-- ARGV[1]  wake-up channel of the lock
-- ARGV[2]  a fresh random token, published as the wake-up's payload (a Redlock
--          manager hears one release from every member and wakes one waiter per
--          payload)
-- ARGV[3]  hand-off base ("<prefix>handoff", see queue_prelude.lua)
-- ARGV[4]  events channel: a lock freed publishes "force-unlocked <token>" on
--          it, then a hand-off "handed-over ..." (queue_prelude.lua)
-- ARGV[5]  (optional) an owner token: the lock is freed only if this owner
--          holds it; absent or '' for whoever holds it
-- ARGV[6]  (optional) ms the receipt is kept; absent or '0': none
--
-- Returns {1, ARGV[2]}  the lock was held: it is deleted (or handed to the head
--                       of its queue) and its waiters told
--         {0, ARGV[2]}  nobody held it (or, with ARGV[5], not that owner)
--         {3, ARGV[2]}  the lock's name holds a value distlock did not write
--                       (another type, or a string of another shape): it is
--                       left as it is, as acquire.lua leaves it
--
-- The holder is not told here: its next renewal finds the lock gone and reports
-- the lease lost, and its release reports `Lost`. The fencing counter stays, so the
-- next holder's token is still larger than the holder's.
local events = ARGV[4] or ''
local receipt_ms = ARGV[6] or '0'
if receipt_ms ~= '0' then
  local done = redis.call('GET', KEYS[5])
  if done then
    return {tonumber(done), ARGV[2]}
  end
end
local function answer(freed)
  if receipt_ms ~= '0' then
    redis.call('SET', KEYS[5], freed, 'PX', receipt_ms)
  end
  return {freed, ARGV[2]}
end
local held = redis.pcall('GET', KEYS[1])
local only = ARGV[5] or ''
if only ~= '' and (type(held) ~= 'string' or string.sub(held, 1, string.len(only)) ~= only) then
  return answer(0)
end
-- Another type answers GET with an error (a table).
if type(held) == 'table' or (held and not is_lock_value(held)) then
  return answer(3)
end
if redis.call('DEL', KEYS[1]) == 1 then
  if events ~= '' then
    redis.call('PUBLISH', events, 'force-unlocked ' .. (string.match(held, '^%d+', 34) or '0'))
  end
  if not queue_hand_off(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[3], events) then
    redis.call('PUBLISH', ARGV[1], ARGV[2])
  end
  return answer(1)
end
return answer(0)
