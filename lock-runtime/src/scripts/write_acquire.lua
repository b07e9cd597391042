-- Take the write side of a read-write lock: when no writer holds it and no
-- reader's lease is running.
--
-- KEYS[1]  writer: a string in the lock format of acquire.lua, TTL the lease
-- KEYS[2]  fencing counter, shared with the readers
-- KEYS[3]  readers: sorted set, owner token -> end of its lease (server ms)
-- KEYS[4]  writer intent: the owner token of a writer waiting for readers to
--          leave; while it exists no new reader enters
-- KEYS[5]  readers' details (see read_acquire.lua)
-- ARGV[1..6]  as acquire.lua: owner, lease ms, fence TTL ('0': unfenced),
--             mark ('+' when the caller waits), since ms, holder
--
-- Returns {1, token, owner}  ours (fresh, or already ours: a retry whose reply
--                            was lost)
--         {0, pttl, owner}   busy: another writer holds it for `pttl` ms, or
--                            readers do until `pttl` ms from now (the longest
--                            reader lease); a waiting caller has marked the
--                            writer, or set its intent
--         {3, 0, owner}      a name of the lock holds a value distlock did not
--                            write (another type or shape): nothing was changed
--
-- A writer that finds readers and waits sets its intent (TTL: its lease, so a
-- writer that dies frees the readers within its lease; one that gives up
-- withdraws it through write_release.lua). Taking the lock clears the intent
-- and marks the hold '+' when an intent existed, since readers may then wait.
local held = redis.pcall('GET', KEYS[1])
if type(held) == 'table' then
  return {3, 0, ARGV[1]}
end
local owner_len = string.len(ARGV[1])
if held then
  if string.sub(held, 1, owner_len) == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return {1, tonumber(string.match(held, '^%d+', owner_len + 2)), ARGV[1]}
  end
  if not is_lock_value(held) then
    return {3, 0, ARGV[1]}
  end
  if ARGV[4] == '+' then
    mark_waited_for(KEYS[1], held)
  end
  return {0, redis.call('PTTL', KEYS[1]), ARGV[1]}
end
local now = now_ms()
if type(redis.pcall('ZCARD', KEYS[3])) == 'table'
    or foreign_details(KEYS[5]) then
  return {3, 0, ARGV[1]}
end
drop_expired(KEYS[3], KEYS[5], now)
local last = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')
if #last > 0 then
  if ARGV[4] == '+' then
    redis.call('SET', KEYS[4], ARGV[1], 'PX', ARGV[2])
  end
  return {0, tonumber(last[2]) - now, ARGV[1]}
end
local mark = ARGV[4]
if redis.call('GET', KEYS[4]) then
  redis.call('DEL', KEYS[4])
  mark = '+'
end
local token = next_token(KEYS[2], ARGV[3])
local value = ARGV[1] .. mark .. string.format('%.0f', token) .. ':' .. ARGV[5] .. ':' .. ARGV[6]
redis.call('SET', KEYS[1], value, 'PX', ARGV[2])
return {1, token, ARGV[1]}
