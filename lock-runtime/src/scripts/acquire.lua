-- Acquire a lock, or confirm that it is already ours, and issue its fencing token.
--
-- KEYS[1]  lock hash {owner token -> fencing token}; its TTL is the lease
-- KEYS[2]  fencing counter: the last token issued for this lock; it expires ARGV[3]
--          milliseconds after the acquisition that wrote it
-- ARGV[1]  owner token (random, 32 hex digits)
-- ARGV[2]  lease in milliseconds
-- ARGV[3]  TTL of the fencing counter in milliseconds (lease + retention)
--
-- Returns {1, token, owner}  the lock is ours with fencing token `token`: freshly
--                            taken, or already ours (a retried acquire whose first
--                            reply was lost); either way the lease is reset to ARGV[2]
--         {0, pttl, owner}   another owner holds it for `pttl` more milliseconds
--                            (-1 when the key has no TTL, which only a foreign writer
--                            causes)
-- `owner` echoes ARGV[1], so the client can tell that a reply is the one to its
-- own request (a connection that lost a reply would hand it another's).
--
-- A fresh token is last token + 1 while the counter exists, and the server time
-- in microseconds once it is gone: expired (ARGV[3] after the last acquisition)
-- or lost to an empty restart. Tokens never run ahead of the server clock (the
-- counter starts at the clock and each script takes more than a microsecond), so
-- the clock keeps them increasing as long as it has not stepped back by more
-- than the time since the last acquisition.
local pttl = redis.call('PTTL', KEYS[1])
if pttl ~= -2 then
  local token = redis.call('HGET', KEYS[1], ARGV[1])
  if token then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return {1, tonumber(token), ARGV[1]}
  end
  return {0, pttl, ARGV[1]}
end

local last = redis.call('GET', KEYS[2])
local token
if last then
  token = tonumber(last) + 1
else
  local now = redis.call('TIME')
  token = tonumber(now[1]) * 1000000 + tonumber(now[2])
end
-- '%.0f' writes the whole number in full; the default conversion may use an exponent.
local text = string.format('%.0f', token)
redis.call('SET', KEYS[2], text, 'PX', ARGV[3])
redis.call('HSET', KEYS[1], ARGV[1], text)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {1, token, ARGV[1]}
