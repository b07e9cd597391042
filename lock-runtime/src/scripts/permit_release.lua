-- Give back a permit if it is ours; wake a waiter if the semaphore was full.
--
-- KEYS[1]  holders (see permit_acquire.lua)
-- KEYS[2]  permit count
-- KEYS[3]  holders' details (see permit_acquire.lua)
-- ARGV[1]  owner token
-- ARGV[2]  wake-up channel
-- ARGV[3]  keep_ms: above 0, the rest of a min_hold: the permit is kept that long
--
-- Returns {1, owner}  the permit was ours and is given back (or kept)
--         {0, owner}  it was not ours any more (its lease had run out)
--
-- The wake-up's payload is the owner token: each manager wakes one waiter per
-- message, as for an exclusive lock; a weighted hold of n permits publishes n
-- messages, since n permits came free.
local now = now_ms()
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score or tonumber(score) <= now then
  drop_expired(KEYS[1], KEYS[3], now)
  push_expiry(KEYS[1], KEYS[2], KEYS[3])
  return {0, ARGV[1]}
end
local keep_ms = tonumber(ARGV[3]) or 0
if keep_ms > 0 then
  redis.call('ZADD', KEYS[1], 'XX', string.format('%.0f', now + keep_ms), ARGV[1])
  push_expiry(KEYS[1], KEYS[2], KEYS[3])
  return {1, ARGV[1]}
end
-- Full: a waiter for one permit was kept out. With weighted holds in the set
-- a waiter for several may have been kept out with permits to spare: wake
-- then too.
local count = tonumber(redis.call('GET', KEYS[2])) or 0
local held = permits_held(KEYS[1])
local weighted = held ~= redis.call('ZCARD', KEYS[1])
local full = held >= count or weighted
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
drop_expired(KEYS[1], KEYS[3], now)
push_expiry(KEYS[1], KEYS[2], KEYS[3])
if full then
  for _ = 1, weight_of(ARGV[1]) do
    redis.call('PUBLISH', ARGV[2], ARGV[1])
  end
end
return {1, ARGV[1]}
