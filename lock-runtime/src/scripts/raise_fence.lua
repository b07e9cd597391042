-- Redlock's write-back round: after a majority granted the lock, make the token
-- chosen (the largest the members issued) known to the fencing counter of each
-- granting member, so that any later majority, which shares a member with this
-- one, issues a larger token.
--
-- KEYS[1]  lock: "<owner><mark><token>:<since>:<holder>" (see acquire.lua)
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
local held = redis.call('GET', KEYS[1])
local owner_len = string.len(ARGV[1])
if held and string.sub(held, 1, owner_len) == ARGV[1] then
  local rest = string.match(held, '^%d+(:.*)$', owner_len + 2)
  local value = string.sub(held, 1, owner_len + 1) .. ARGV[2] .. rest
  redis.call('SET', KEYS[1], value, 'XX', 'KEEPTTL')
  return {1, ARGV[1]}
end
return {0, ARGV[1]}
