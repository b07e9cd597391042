-- Release the write side of a read-write lock if it is ours, and withdraw our
-- writer intent if we left one (a writer that stopped waiting).
--
-- KEYS[1]  writer (see write_acquire.lua)
-- KEYS[2]  writer intent
-- KEYS[3]  this release's receipt, optional (Cluster and Sentinel, whose
--          clients send a call again when its connection broke before the
--          reply): set to ARGV[5] for ARGV[4] ms when the hold was ours, so
--          that the release sent again answers what the first run did
-- ARGV[1]  owner token
-- ARGV[2]  wake-up channel
-- ARGV[3]  keep_ms: above 0, the rest of a min_hold: the writer is kept that
--          long instead of deleted, and nobody is woken
-- ARGV[4]  ms the receipt KEYS[3] is kept (with KEYS[3] only)
-- ARGV[5]  the release call's id, the receipt's value (with KEYS[3] only)
--
-- Returns {1, owner}  the writer was ours and is released (or kept)
--         {0, owner}  it was not ours (our lease ran out, or we never held
--                     it: the release only withdrew an intent), and no
--                     earlier run of this release found it ours
--
-- Wake-ups on a read-write lock's channel start with '*': every waiter of each
-- manager retries (readers may all enter at once, and a waiting writer must
-- not be passed over by a reader that cannot enter).
local owner_len = string.len(ARGV[1])
if redis.call('GET', KEYS[2]) == ARGV[1] then
  redis.call('DEL', KEYS[2])
  redis.call('PUBLISH', ARGV[2], '*' .. ARGV[1])
end
local held = redis.call('GET', KEYS[1])
if held and string.sub(held, 1, owner_len) == ARGV[1] then
  if KEYS[3] then
    redis.call('SET', KEYS[3], ARGV[5], 'PX', ARGV[4])
  end
  local keep_ms = tonumber(ARGV[3]) or 0
  if keep_ms > 0 then
    redis.call('PEXPIRE', KEYS[1], keep_ms)
    return {1, ARGV[1]}
  end
  redis.call('DEL', KEYS[1])
  if string.sub(held, owner_len + 1, owner_len + 1) == '+' then
    redis.call('PUBLISH', ARGV[2], '*' .. ARGV[1])
  end
  return {1, ARGV[1]}
end
if KEYS[3] and redis.call('GET', KEYS[3]) == ARGV[5] then
  return {1, ARGV[1]}
end
return {0, ARGV[1]}
