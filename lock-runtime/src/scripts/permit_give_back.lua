-- Give back part of a weighted semaphore hold and keep the rest: the hold's
-- member is renamed to an owner token that names the smaller weight (see
-- weight_of in shared_prelude.lua), keeping its lease end and its details, and
-- waiters are woken for the permits that came free, as permit_release.lua does.
--
-- KEYS[1]  holders (see permit_acquire.lua)
-- KEYS[2]  permit count
-- KEYS[3]  holders' details (see permit_acquire.lua)
-- ARGV[1]  owner token of the hold, "<token>:<weight>"
-- ARGV[2]  owner token of what is kept, "<token>:<smaller weight>" (or "<token>"
--          for a weight of 1)
-- ARGV[3]  wake-up channel
--
-- Returns {1, ARGV[1]}  given back: ARGV[2] now holds the rest, until the
--                       hold's lease end; also when ARGV[2] holds it already
--                       (this script ran, and its reply was lost with its
--                       connection: a cluster client sends it again)
--         {0, ARGV[1]}  the hold was not ours any more (its lease had run out)
--
-- One wake-up message, whether or not the semaphore was full: the hold is
-- weighted, so a waiter for several permits may have been kept out with
-- permits to spare (as in permit_release.lua). As there, the payload is the old
-- owner token for one permit given back, "#<n>:<old owner token>" for n: a
-- manager gives its longest waiter n wake-ups.
--
-- Bound: one PUBLISH whatever the number of permits given back (a caller's
-- number); the rest as permit_release.lua.
local now = now_ms()
local score = live_hold(KEYS[1], KEYS[2], KEYS[3], ARGV[1], now)
if not score then
  if live_hold(KEYS[1], KEYS[2], KEYS[3], ARGV[2], now) then
    return {1, ARGV[1]}
  end
  return {0, ARGV[1]}
end
local details = redis.call('HGET', KEYS[3], ARGV[1])
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('ZADD', KEYS[1], score, ARGV[2])
if details then
  redis.call('HSET', KEYS[3], ARGV[2], details)
end
drop_expired(KEYS[1], KEYS[3], now)
push_expiry(KEYS[1], KEYS[2], KEYS[3])
local freed = weight_of(ARGV[1]) - weight_of(ARGV[2])
if freed == 1 then
  redis.call('PUBLISH', ARGV[3], ARGV[1])
else
  redis.call('PUBLISH', ARGV[3], '#' .. string.format('%.0f', freed) .. ':' .. ARGV[1])
end
return {1, ARGV[1]}
