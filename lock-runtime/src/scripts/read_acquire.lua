-- Take a read hold of a read-write lock: when no writer holds it and none waits.
--
-- KEYS[1]  readers: sorted set, owner token -> end of its lease (server ms);
--          its TTL is the end of the longest lease
-- KEYS[2]  fencing counter, shared with the writers
-- KEYS[3]  writer (see write_acquire.lua)
-- KEYS[4]  writer intent (see write_acquire.lua)
-- KEYS[5]  readers' details: owner token -> "<token>:<since>:<holder>" (see
--          shared_prelude.lua), TTL as KEYS[1]
-- ARGV[1..4]  owner, lease ms, fence TTL ('0': unfenced), mark ('+' when the
--             caller waits)
-- ARGV[5..6]  since ms, holder (as acquire.lua), for the details
--
-- Returns {1, token, owner}  the read hold is ours (a retry of ours keeps its
--                            place and gets a fresh token)
--         {0, pttl, owner}   a writer holds the lock for `pttl` ms, or waits for
--                            it (its intent lasts `pttl` ms more); a waiting
--                            caller has marked the writer's hold
--         {3, 0, owner}      a name of the lock holds a value distlock did not
--                            write (another type or shape): nothing was changed
local held = redis.pcall('GET', KEYS[3])
if type(held) == 'table' or (held and not is_lock_value(held)) then
  return {3, 0, ARGV[1]}
end
if held then
  if ARGV[4] == '+' then
    mark_waited_for(KEYS[3], held)
  end
  return {0, redis.call('PTTL', KEYS[3]), ARGV[1]}
end
local now = now_ms()
local mine = redis.pcall('ZSCORE', KEYS[1], ARGV[1])
if type(mine) == 'table' and mine.err then
  return {3, 0, ARGV[1]}
end
if not mine and redis.call('GET', KEYS[4]) then
  return {0, redis.call('PTTL', KEYS[4]), ARGV[1]}
end
if foreign_details(KEYS[5]) then
  return {3, 0, ARGV[1]}
end
drop_expired(KEYS[1], KEYS[5], now)
local token = next_token(KEYS[2], ARGV[3])
redis.call('ZADD', KEYS[1], string.format('%.0f', now + tonumber(ARGV[2])), ARGV[1])
describe(KEYS[5], ARGV[1], token, ARGV[5], ARGV[6])
push_expiry(KEYS[1], KEYS[5])
return {1, token, ARGV[1]}
