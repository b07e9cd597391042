-- Release a read hold if it is ours; the last reader out wakes a waiting writer.
--
-- KEYS[1]  readers (see read_acquire.lua)
-- KEYS[2]  writer intent
-- KEYS[3]  readers' details (see read_acquire.lua)
-- KEYS[4]  this release's receipt, optional (Cluster and Sentinel, whose
--          clients send a call again when its connection broke before the
--          reply): set to ARGV[5] for ARGV[4] ms when the hold was ours, so
--          that the release sent again answers what the first run did
-- ARGV[1]  owner token
-- ARGV[2]  wake-up channel
-- ARGV[3]  keep_ms: above 0, the rest of a min_hold: the hold is kept that long
-- ARGV[4]  ms the receipt KEYS[4] is kept (with KEYS[4] only)
-- ARGV[5]  the release call's id, the receipt's value (with KEYS[4] only)
--
-- Returns {1, owner}  the hold was ours and is released (or kept)
--         {0, owner}  it was not ours any more (its lease had run out), and
--                     no earlier run of this release found it ours
--
-- The wake-up starts with '*' (see write_release.lua) and is sent only when the
-- last reader leaves while a writer has announced its intent.
local now = now_ms()
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score or tonumber(score) <= now then
  drop_expired(KEYS[1], KEYS[3], now)
  push_expiry(KEYS[1], KEYS[3])
  if KEYS[4] and redis.call('GET', KEYS[4]) == ARGV[5] then
    return {1, ARGV[1]}
  end
  return {0, ARGV[1]}
end
if KEYS[4] then
  redis.call('SET', KEYS[4], ARGV[5], 'PX', ARGV[4])
end
local keep_ms = tonumber(ARGV[3]) or 0
if keep_ms > 0 then
  redis.call('ZADD', KEYS[1], 'XX', string.format('%.0f', now + keep_ms), ARGV[1])
  push_expiry(KEYS[1], KEYS[3])
  return {1, ARGV[1]}
end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
drop_expired(KEYS[1], KEYS[3], now)
push_expiry(KEYS[1], KEYS[3])
if redis.call('ZCARD', KEYS[1]) == 0 and redis.call('GET', KEYS[2]) then
  redis.call('PUBLISH', ARGV[2], '*' .. ARGV[1])
end
return {1, ARGV[1]}
