-- Redlock's write-back round: after a majority granted the lock, make the token
-- chosen (the largest the members issued) known to the fencing counter of each
-- granting member, so that any later majority, which shares a member with this
-- one, issues a larger token.
--
-- KEYS[1]  lock hash {owner token -> fencing token}
-- KEYS[2]  fencing counter
-- ARGV[1]  owner token
-- ARGV[2]  the token chosen (an integer of at most 2^53)
-- ARGV[3]  TTL of the fencing counter in milliseconds (lease + retention)
--
-- Returns {1, owner}  the lock is ours: the counter is at least ARGV[2] and the
--                     lock records ARGV[2] as our token
--         {0, owner}  the lock is gone or another owner's: the counter is still
--                     raised (harmless: tokens only need to grow)
--
-- `owner` echoes ARGV[1], so the client can tell that a reply is the one to its
-- own request.
local chosen = tonumber(ARGV[2])
local last = tonumber(redis.call('GET', KEYS[2]) or '0')
if last < chosen then
  redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
end
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
  return {1, ARGV[1]}
end
return {0, ARGV[1]}
