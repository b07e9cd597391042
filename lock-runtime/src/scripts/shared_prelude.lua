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
-- push_expiry(set, ...): sets the TTL of sorted set `set` (and of the other
-- names given) to the end of its longest lease, so that nothing outlives its
-- holders; deletes them all when the set is empty.
--
-- drop_expired(set, details, now): removes the holders of `set` whose lease
-- ended by `now`, and their entries in `details`.
--
-- The holders of a shared kind (read holds, permits) are described in a hash
-- beside their sorted set, for operators: owner token ->
-- "<token>:<since>:<holder>" (the lock value's format after its mark). An
-- entry is written with its hold and removed with it; the hash's TTL follows
-- the set's. Its field '!' (never an owner token, which is hex) marks the
-- hash as distlock's: foreign_details(details) is true for a hash without it,
-- or a value of another type, which a script must leave alone.
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

local function push_expiry(set, ...)
  local others = {...}
  local last = redis.call('ZRANGE', set, -1, -1, 'WITHSCORES')
  if #last == 0 then
    redis.call('DEL', set)
    for _, other in ipairs(others) do
      redis.call('DEL', other)
    end
    return
  end
  redis.call('PEXPIREAT', set, last[2])
  for _, other in ipairs(others) do
    redis.call('PEXPIREAT', other, last[2])
  end
end
local function foreign_details(details)
  if redis.call('PTTL', details) == -2 then
    return false
  end
  local mark = redis.pcall('HGET', details, '!')
  return type(mark) == 'table' or not mark
end
local function describe(details, owner, token, since, holder)
  redis.call('HSET', details, '!', '1', owner, string.format('%.0f', token) .. ':' .. since .. ':' .. holder)
end
local function drop_expired(set, details, now)
  -- The set is ordered by the end of each lease: the expired holders come
  -- first. (By index, not ZRANGE ... BYSCORE, which Redis 6.0 lacks.)
  while true do
    local first = redis.call('ZRANGE', set, 0, 0, 'WITHSCORES')
    if #first == 0 or tonumber(first[2]) > now then
      return
    end
    redis.call('ZREM', set, first[1])
    redis.call('HDEL', details, first[1])
  end
end
-- The members of `set` whose lease has not ended by `now`, with their scores
-- (member, score, member, score, ...).
local function live_members(set, now)
  local all = redis.pcall('ZRANGE', set, 0, -1, 'WITHSCORES')
  if all.err then
    return all
  end
  local live = {}
  for i = 1, #all, 2 do
    if tonumber(all[i + 1]) > now then
      live[#live + 1] = all[i]
      live[#live + 1] = all[i + 1]
    end
  end
  return live
end
-- mark_waited_for(name, held): marks the lock value `held`, stored at
-- `name`, as waited for ('+' after its 32-digit owner token; TTL kept), so
-- that its release wakes a waiter or hands it on. True when this call marked
-- it (it was not marked before).
local function mark_waited_for(name, held)
  if string.sub(held, 33, 33) ~= '+' then
    redis.call('SET', name, string.sub(held, 1, 32) .. '+' .. string.sub(held, 34), 'XX', 'KEEPTTL')
    return true
  end
  return false
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

-- The lease end of the hold `member` of a semaphore's holders `set`, or nil
-- when it is gone or its lease ran out; then the expired holders are dropped
-- and the names' expiry set again (`count`: the permit count, `details`: the
-- holders' details), as every release of a hold that is not ours does.
local function live_hold(set, count, details, member, now)
  local score = redis.call('ZSCORE', set, member)
  if not score or tonumber(score) <= now then
    drop_expired(set, details, now)
    push_expiry(set, count, details)
    return nil
  end
  return score
end
