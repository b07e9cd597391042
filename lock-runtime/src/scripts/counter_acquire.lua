-- Take permits of a counting semaphore: when at least that many are
-- available, lower the count by them; otherwise, for a caller that waits,
-- record it as waiting so that the next change that makes permits available
-- publishes a wake-up.
--
-- KEYS[1]  the counter: available permits, a decimal string (see
--          counter_prelude.lua); no TTL
-- KEYS[2]  waiters: sorted set, owner token -> end of its registration
--          (server ms); its TTL is the end of the longest registration
-- KEYS[3]  the receipt of this acquisition (see counter_prelude.lua)
-- ARGV[1]  owner token of the acquisition (echoed; its waiter entry)
-- ARGV[2]  permits wanted: a positive canonical decimal (at most 2^63 - 1)
-- ARGV[3]  registration ms: above 0, a caller that will wait records itself
--          (or refreshes its entry) for that long when too few are available;
--          '0' for a caller that will not wait
-- ARGV[4]  ms the receipt is kept, once the permits are taken; '0': none is
--          written (a client that never sends a call twice)
--
-- Returns {1, available, owner, waiters}  the permits are ours; `available`
--                                         is what is left (decimal string)
--         {0, available, owner, waiters}  too few are available (the counter
--                                         as it is, '0' when it does not
--                                         exist); nothing taken
--         {1, available, owner, waiters}  also when the receipt says the
--                                         permits were taken by this
--                                         acquisition already (`available`
--                                         as it was then); nothing taken
--         {3, '0', owner, 0}              a name holds a value distlock did
--                                         not write: nothing was changed
-- `waiters`: registrations live after the call.
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
local registration = tonumber(ARGV[3])
if count and at_least(count, ARGV[2]) then
  redis.call('DECRBY', KEYS[1], ARGV[2])
  local left = redis.call('GET', KEYS[1])
  keep_receipt(KEYS[3], left, ARGV[4])
  -- Its entry goes, whether or not this attempt would have registered
  -- (the last attempt of a wait, at its deadline, does not).
  if waiting > 0 and redis.call('ZREM', KEYS[2], ARGV[1]) == 1 then
    waiting = live_waiters(KEYS[2], now)
  end
  return {1, left, ARGV[1], waiting}
end
if registration > 0 then
  -- Entries whose waiter left without a word (cancelled, crashed) go when
  -- their registration ends: removing them is the server's work over the
  -- set, never a loop over a caller's number.
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', string.format('%.0f', now))
  local ends = now + registration
  redis.call('ZADD', KEYS[2], string.format('%.0f', ends), ARGV[1])
  if redis.call('PTTL', KEYS[2]) < registration then
    redis.call('PEXPIRE', KEYS[2], registration)
  end
  waiting = redis.call('ZCARD', KEYS[2])
end
return {0, count or '0', ARGV[1], waiting}
