-- Issue the fencing token of a hold that did not take one at acquisition
-- (fencing on demand), or read the one it has.
--
-- KEYS[1]  lock: "<owner><mark><token>:<since>:<holder>" (see acquire.lua; a
--          write lock's string has the same format)
-- KEYS[2]  fencing counter: the last token issued for this lock
-- ARGV[1]  owner token
-- ARGV[2]  TTL of the fencing counter in milliseconds (lease + retention)
--
-- Returns {1, token, owner}  the lock is ours, and `token` is its fencing
--                            token: the one it already had, or a new one (last
--                            + 1 while the counter exists, the server time in
--                            microseconds once it is gone, as acquire.lua),
--                            now written into the lock's value (TTL kept) and
--                            the counter; a token it had is written again
--                            unchanged
--         {0, 0, owner}      the lock is gone or another owner's: no token is
--                            issued, and the holder has lost it
-- `owner` echoes ARGV[1], so the client can tell that a reply is the one to its
-- own request.
local owner = ARGV[1]
local owner_len = string.len(owner)
local held = redis.pcall('GET', KEYS[1])
if type(held) ~= 'string' or string.sub(held, 1, owner_len) ~= owner then
  return {0, 0, owner}
end
local current, rest = string.match(held, '^(%d+)(:.*)$', owner_len + 2)
if not current then
  return {0, 0, owner}
end
if tonumber(current) > 0 then
  -- The same value written again (a no-op for readers): the connection's
  -- last write then follows the token's, so that a WAIT after this script
  -- (replica_ack) counts only replicas that have the token, whichever
  -- connection issued it.
  redis.call('SET', KEYS[1], held, 'XX', 'KEEPTTL')
  return {1, tonumber(current), owner}
end
local token = next_token(KEYS[2], ARGV[2])
redis.call('SET', KEYS[1], string.sub(held, 1, owner_len + 1) .. string.format('%.0f', token) .. rest,
  'XX', 'KEEPTTL')
return {1, token, owner}
