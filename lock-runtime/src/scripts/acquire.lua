-- Acquire a lock, or confirm that it is already ours, and issue its fencing token.
--
-- KEYS[1]  lock: a string "<owner><mark><token>:<since>:<holder>" whose TTL is the
--          lease. <owner> is the owner token, <mark> is '+' once someone waits for
--          the lock (its release then publishes a wake-up) and '-' before,
--          <token> the fencing token, <since> the acquisition time (client clock,
--          milliseconds since the Unix epoch) and <holder> the holder's
--          description (free text, for operators).
-- KEYS[2]  fencing counter: the last token issued for this lock; it expires ARGV[3]
--          milliseconds after the acquisition that wrote it
-- ARGV[1]  owner token (random, 32 hex digits)
-- ARGV[2]  lease in milliseconds
-- ARGV[3]  TTL of the fencing counter in milliseconds (lease + retention); '0' for
--          a manager without fencing: the token is 0 and the counter is not touched
-- ARGV[4]  '+' when the caller waits for this lock (it listens for wake-ups), '-'
--          when it does not (a first try, or try_acquire)
-- ARGV[5]  <since>
-- ARGV[6]  <holder>
--
-- Returns {1, token, owner}  the lock is ours with fencing token `token`: freshly
--                            taken, or already ours (a retried acquire whose first
--                            reply was lost); either way the lease is reset to ARGV[2]
--         {0, pttl, owner}   another owner holds it for `pttl` more milliseconds
--                            (-1 when the key has no TTL, which only a foreign writer
--                            causes); a waiting caller has marked it
-- `owner` echoes ARGV[1], so the client can tell that a reply is the one to its
-- own request (a connection that lost a reply would hand it another's).
--
-- A waiter marks the lock in the same script that finds it busy, so the holder's
-- release, which publishes only for a marked lock, cannot miss it; a waiter that
-- wins marks its own hold, since others may still wait. A lock nobody waited for
-- is released without a PUBLISH.
--
-- A fresh token is last token + 1 while the counter exists, and the server time
-- in microseconds once it is gone: expired (ARGV[3] after the last acquisition)
-- or lost to an empty restart. Tokens never run ahead of the server clock (the
-- counter starts at the clock and each script takes more than a microsecond), so
-- the clock keeps them increasing as long as it has not stepped back by more
-- than the time since the last acquisition.
--
-- The fast path (the lock is free) is three commands: GET, SET NX, SET. A lock
-- key of distlock 0.1 (a hash) makes GET fail with WRONGTYPE: mixed versions
-- refuse each other's locks rather than both granting them.
local fenced = ARGV[3] ~= '0'
local token = 0
if fenced then
  local last = redis.call('GET', KEYS[2])
  if last then
    token = tonumber(last) + 1
  else
    local now = redis.call('TIME')
    token = tonumber(now[1]) * 1000000 + tonumber(now[2])
  end
end
-- '%.0f' writes the whole number in full; the default conversion may use an exponent.
local text = string.format('%.0f', token)
local value = ARGV[1] .. ARGV[4] .. text .. ':' .. ARGV[5] .. ':' .. ARGV[6]
if redis.call('SET', KEYS[1], value, 'NX', 'PX', ARGV[2]) then
  if fenced then
    redis.call('SET', KEYS[2], text, 'PX', ARGV[3])
  end
  return {1, token, ARGV[1]}
end

local held = redis.call('GET', KEYS[1])
local owner_len = string.len(ARGV[1])
if string.sub(held, 1, owner_len) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, tonumber(string.match(held, '^%d+', owner_len + 2)), ARGV[1]}
end
if ARGV[4] == '+' and string.sub(held, owner_len + 1, owner_len + 1) ~= '+' then
  local marked = string.sub(held, 1, owner_len) .. '+' .. string.sub(held, owner_len + 2)
  redis.call('SET', KEYS[1], marked, 'XX', 'KEEPTTL')
end
return {0, redis.call('PTTL', KEYS[1]), ARGV[1]}
