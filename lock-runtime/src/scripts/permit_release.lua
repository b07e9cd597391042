-- Give back a permit if it is ours; wake waiters if one may now get in.
--
-- KEYS[1]  holders (see permit_acquire.lua)
-- KEYS[2]  permit count
-- KEYS[3]  holders' details, with the largest waiting weight (see
--          permit_acquire.lua)
-- KEYS[4]  this release's receipt, optional (Cluster and Sentinel, whose
--          clients send a call again when its connection broke before the
--          reply): set to ARGV[5] for ARGV[4] ms when the hold was ours, so
--          that the release sent again answers what the first run did
-- ARGV[1]  owner token
-- ARGV[2]  wake-up channel
-- ARGV[3]  keep_ms: above 0, the rest of a min_hold: the permit is kept that long
-- ARGV[4]  ms the receipt KEYS[4] is kept (with KEYS[4] only)
-- ARGV[5]  the release call's id, the receipt's value (with KEYS[4] only)
--
-- Returns {1, owner}  the permit was ours and is given back (or kept)
--         {0, owner}  it was not ours any more (its lease had run out), and
--                     no earlier run of this release found it ours
--
-- A release wakes when fewer permits were free before it than the largest
-- waiting weight recorded (1 without a record: a waiter for one permit is
-- kept out only by a full semaphore), so a waiter for several is woken by the
-- release that frees its last permit, even when every hold is of one permit;
-- and whenever a weighted hold is in the set (a waiter that has not attempted
-- since it began to listen has recorded nothing yet). The wake-up is one
-- message whatever the weight: the owner token for one permit,
-- "#<n>:<owner>" for a weighted hold of n (n: the permits that came free). A
-- manager gives its longest waiter n wake-ups, and a waiter that gets its
-- permits passes the rest on to its next (see waiting.rs).
--
-- Bound: one PUBLISH per call, whatever the weight. The rest reads the
-- holders once (permits_held: as many as there are live holds, each taken by
-- an acquisition of its own) and removes expired ones (drop_expired: each
-- holder is removed once).
local now = now_ms()
local score = live_hold(KEYS[1], KEYS[2], KEYS[3], ARGV[1], now)
if not score then
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
  push_expiry(KEYS[1], KEYS[2], KEYS[3])
  return {1, ARGV[1]}
end
local count = tonumber(redis.call('GET', KEYS[2])) or 0
local held = permits_held(KEYS[1])
local recorded = redis.pcall('HGET', KEYS[3], '?')
local largest_waiting = type(recorded) == 'string' and tonumber(recorded) or 1
local wake = count - held < largest_waiting or held ~= redis.call('ZCARD', KEYS[1])
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
drop_expired(KEYS[1], KEYS[3], now)
push_expiry(KEYS[1], KEYS[2], KEYS[3])
if wake then
  local freed = weight_of(ARGV[1])
  if freed == 1 then
    redis.call('PUBLISH', ARGV[2], ARGV[1])
  else
    redis.call('PUBLISH', ARGV[2], '#' .. string.format('%.0f', freed) .. ':' .. ARGV[1])
  end
end
return {1, ARGV[1]}
