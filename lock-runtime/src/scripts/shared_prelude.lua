-- Shared by the scripts of every kind (prepended to each by the client; Redis
-- scripts cannot include one another).
--
-- now_ms(): the server clock in milliseconds. Holders of shared kinds are
-- scored by the end of their lease on this clock, so every client agrees on
-- when a holder has expired whatever its own clock says.
--
-- next_token(fence, ttl): the next fencing token for the lock whose counter is
-- `fence`, stored back with TTL `ttl` ms; 0 and untouched when `ttl` is '0' (a
-- manager without fencing). As in acquire.lua: last + 1 while the counter
-- exists, the server time in microseconds once it is gone.
--
-- is_lock_value(value): whether a string is a lock value distlock wrote; a
-- script never changes one that is not, and answers {3, 0, owner} ("foreign").
--
-- push_expiry(set, other): sets the TTL of sorted set `set` (and of `other`,
-- when given) to the end of its longest lease, so that nothing outlives its
-- holders; deletes both when the set is empty.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function next_token(fence, ttl)
  if ttl == '0' then
    return 0
  end
  local last = redis.call('GET', fence)
  local token
  if last then
    token = tonumber(last) + 1
  else
    local t = redis.call('TIME')
    token = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  redis.call('SET', fence, string.format('%.0f', token), 'PX', ttl)
  return token
end

local function push_expiry(set, other)
  local last = redis.call('ZRANGE', set, -1, -1, 'WITHSCORES')
  if #last == 0 then
    redis.call('DEL', set)
    if other then
      redis.call('DEL', other)
    end
    return
  end
  redis.call('PEXPIREAT', set, last[2])
  if other then
    redis.call('PEXPIREAT', other, last[2])
  end
end
-- Whether `value` is a lock value distlock wrote
-- ("<32 hex owner><mark><token>:<since>:<holder>"): a script never changes a
-- value that is not (a foreign key under a lock's name).
local function is_lock_value(value)
  return string.find(value, '^%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x[+-]%d+:%d+:') ~= nil
end
-- The permits a semaphore holder's member stands for: "<owner>:<n>" is a
-- weighted hold of n permits, a plain owner token one.
local function weight_of(member)
  return tonumber(string.match(member, ':(%d+)$')) or 1
end
-- Permits held by the members of a semaphore's holders set.
local function permits_held(set)
  local held = 0
  for _, member in ipairs(redis.call('ZRANGE', set, 0, -1)) do
    held = held + weight_of(member)
  end
  return held
end
