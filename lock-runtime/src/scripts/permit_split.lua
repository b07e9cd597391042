-- Split a weighted semaphore hold into holds of one permit each: the hold's
-- member is replaced by one member per permit, each under an owner token of
-- its own, with the hold's lease end and details (fencing token, since,
-- holder). The permits held stay the same, so nobody is woken.
--
-- KEYS[1]  holders (see permit_acquire.lua)
-- KEYS[2]  permit count
-- KEYS[3]  holders' details (see permit_acquire.lua)
-- ARGV[1]  owner token of the hold, "<token>:<n>"
-- ARGV[2..n+1]  the n owner tokens of the single permits (no ":<digits>" end)
--
-- Returns {1, ARGV[1]}  split: each of ARGV[2..] holds one permit until the
--                       hold's lease end; also when ARGV[2] holds one already
--                       (this script ran, and its reply was lost with its
--                       connection: a cluster client sends it again)
--         {0, ARGV[1]}  the hold was not ours any more (its lease had run out)
--         an error      ARGV[2..] are not as many as the hold's permits:
--                       nothing was changed
--
-- Bound: one ZADD and one HSET per permit, and the client sends at most
-- MAX_SPLIT_PERMITS (permits.rs) tokens; drop_expired and push_expiry as in
-- permit_release.lua.
local now = now_ms()
local score = live_hold(KEYS[1], KEYS[2], KEYS[3], ARGV[1], now)
if not score then
  if live_hold(KEYS[1], KEYS[2], KEYS[3], ARGV[2], now) then
    return {1, ARGV[1]}
  end
  return {0, ARGV[1]}
end
if #ARGV - 1 ~= weight_of(ARGV[1]) then
  return redis.error_reply('permit_split: ' .. (#ARGV - 1) .. ' tokens for a hold of '
    .. weight_of(ARGV[1]) .. ' permits')
end
local details = redis.call('HGET', KEYS[3], ARGV[1])
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
for i = 2, #ARGV do
  redis.call('ZADD', KEYS[1], score, ARGV[i])
  if details then
    redis.call('HSET', KEYS[3], ARGV[i], details)
  end
end
drop_expired(KEYS[1], KEYS[3], now)
push_expiry(KEYS[1], KEYS[2], KEYS[3])
return {1, ARGV[1]}
