-- Take a fair lock, or confirm that it is already ours; a waiting caller that
-- finds it busy queues up (or refreshes its place) in the same script.
--
-- KEYS[1]  lock: a string in the format of acquire.lua, with the lease as TTL
-- KEYS[2]  fencing counter
-- KEYS[3]  queue: sorted set, owner token -> arrival time (fair_prelude.lua)
-- KEYS[4]  queue entries: hash, owner token ->
--          "<expiry>:<ttl>:<fence_ttl>:<route>:<holder>"
-- ARGV[1..6]  as acquire.lua: owner, lease ms, fence TTL ('0': unfenced), mark
--             ('+' when the caller waits: it queues up), since ms, holder
-- ARGV[7]  queue lease ms: the caller's entry lasts that long unless refreshed
--          by its next attempt
-- ARGV[8]  hand-off TTL ms: the TTL the lock gets when it is handed to the
--          caller; at most the queue lease for a holder that renews (its first
--          renewal, due a third of it after the hand-off, brings the TTL up to
--          its lease), the whole lease for one that does not renew
-- ARGV[9]  wake-up channel, for the hand-offs this script makes (each on
--          "<channel>:<route of the new holder>")
-- ARGV[10] route: the hand-off tag of the caller's manager (hex), kept in its
--          queue entry; a hand-off to the caller is published on
--          "<channel>:<route>", which that manager listens to
--
-- Returns {1, token, owner}  ours with fencing token `token`: freshly taken, or
--                            already ours (handed off to us by a release, or a
--                            retry whose reply was lost); the TTL is reset to
--                            the lease and our queue entry is gone
--         {0, pttl, owner}   busy: another owner holds it for `pttl` more ms
--                            (-1 for a waiting caller, which is in the queue
--                            now and waits for its hand-off, not for a TTL)
--
-- The lock is free for the caller only when nobody live is queued before it.
-- A free lock with a live head that is not the caller (its holder's lease ran
-- out, nobody released it) is handed to that head here, at once, rather than
-- when the head's next attempt comes.
local now, now_us = fair_clock()
local owner_len = string.len(ARGV[1])
local held = redis.call('GET', KEYS[1])
if held and string.sub(held, 1, owner_len) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  fair_drop(KEYS[3], KEYS[4], ARGV[1])
  return {1, tonumber(string.match(held, '^%d+', owner_len + 2)), ARGV[1]}
end
if not held then
  local head = fair_head(KEYS[3], KEYS[4], now)
  if head == nil or head == ARGV[1] then
    local token = next_token(KEYS[2], ARGV[3])
    local value = ARGV[1] .. '-' .. string.format('%.0f', token) .. ':' .. ARGV[5] .. ':' .. ARGV[6]
    redis.call('SET', KEYS[1], value, 'PX', ARGV[2])
    if head then
      fair_drop(KEYS[3], KEYS[4], ARGV[1])
    end
    return {1, token, ARGV[1]}
  end
  fair_hand_off(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[9], now)
end
if ARGV[4] == '+' then
  fair_enqueue(KEYS[3], KEYS[4], ARGV[1], now, now_us, ARGV[7], ARGV[8], ARGV[3], ARGV[10], ARGV[6])
  return {0, -1, ARGV[1]}
end
return {0, redis.call('PTTL', KEYS[1]), ARGV[1]}
