-- Shared by the fair lock's scripts (prepended after shared_prelude.lua).
--
-- A fair lock's waiters queue in Redis, in arrival order:
--   queue    sorted set: owner token -> arrival number (1, 2, ...; each new
--            entry gets the last number + 1)
--   entries  hash: owner token -> "<expiry>:<ttl>:<fence_ttl>:<holder>", where
--            <expiry> is the end of the entry's queue lease (server clock, ms),
--            <ttl> the TTL a hand-off gives the lock (at most the queue lease
--            for a holder that renews, see fair_acquire.lua), <fence_ttl> the
--            TTL of the fencing counter it sets ('0': unfenced) and <holder>
--            the waiter's description
-- Both live as long as their longest queue lease and go with their last entry.
-- An entry whose queue lease has run out (a waiter that died) is dropped when
-- it reaches the head of the queue, so it never blocks the queue longer.
--
-- fair_hand_off gives a free lock to the first live entry: it writes the lock
-- in the owner's name ("<owner>-<token>:<now>:<holder>", TTL <ttl>), removes
-- the entry and publishes "=<owner>:<token>" on the wake-up channel, so that
-- the waiter holds the lock without another round trip.
local function fair_drop(queue, entries, owner)
  if redis.call('ZREM', queue, owner) == 1 then
    redis.call('HDEL', entries, owner)
  end
end

local function fair_tidy(queue, entries)
  if redis.call('ZCARD', queue) == 0 then
    redis.call('DEL', queue, entries)
  end
end

-- The first entry whose queue lease runs: owner, ttl, fence_ttl, holder; nil
-- for none. Expired entries met on the way are dropped.
local function fair_head(queue, entries, now)
  while true do
    local first = redis.call('ZRANGE', queue, 0, 0)
    if #first == 0 then
      return nil
    end
    local owner = first[1]
    local entry = redis.call('HGET', entries, owner)
    if entry then
      local expiry, ttl, fence_ttl, holder = string.match(entry, '^(%d+):(%d+):(%d+):(.*)$')
      if expiry and tonumber(expiry) > now then
        return owner, ttl, fence_ttl, holder
      end
    end
    fair_drop(queue, entries, owner)
  end
end

-- Adds `owner` at the end of the queue (or keeps its place), and starts a new
-- queue lease for its entry.
local function fair_enqueue(queue, entries, owner, now, queue_lease, ttl, fence_ttl, holder)
  if not redis.call('ZSCORE', queue, owner) then
    local last = redis.call('ZRANGE', queue, -1, -1, 'WITHSCORES')
    local number = 1
    if #last > 0 then
      number = tonumber(last[2]) + 1
    end
    redis.call('ZADD', queue, string.format('%.0f', number), owner)
  end
  local expiry = now + tonumber(queue_lease)
  redis.call('HSET', entries, owner,
    string.format('%.0f', expiry) .. ':' .. ttl .. ':' .. fence_ttl .. ':' .. holder)
  if redis.call('PTTL', queue) < tonumber(queue_lease) then
    redis.call('PEXPIRE', queue, queue_lease)
  end
  if redis.call('PTTL', entries) < tonumber(queue_lease) then
    redis.call('PEXPIRE', entries, queue_lease)
  end
end

-- Gives the (free) lock to the head of the queue; returns its owner, or nil
-- when nobody waits.
local function fair_hand_off(lock, fence, queue, entries, channel, now)
  local owner, ttl, fence_ttl, holder = fair_head(queue, entries, now)
  if not owner then
    -- The queue is empty, and Redis deleted it with its last member; the
    -- entries went with it (fair_drop removes both), or expire with their TTL.
    return nil
  end
  local token = next_token(fence, fence_ttl)
  local text = string.format('%.0f', token)
  redis.call('SET', lock, owner .. '-' .. text .. ':' .. string.format('%.0f', now) .. ':' .. holder,
    'PX', ttl)
  fair_drop(queue, entries, owner)
  fair_tidy(queue, entries)
  redis.call('PUBLISH', channel, '=' .. owner .. ':' .. text)
  return owner
end

