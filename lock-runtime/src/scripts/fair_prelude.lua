-- Shared by the fair lock's scripts (prepended after shared_prelude.lua).
--
-- A fair lock's waiters queue in Redis, in arrival order:
--   queue    sorted set: owner token -> arrival time (server clock, in
--            microseconds: one script takes more than a microsecond, so no
--            two arrivals tie; a server clock stepped back by d puts arrivals
--            of the next d ahead of earlier ones: a question of order, never
--            of exclusion)
--   entries  hash: owner token -> "<expiry>:<ttl>:<fence_ttl>:<route>:<holder>",
--            where <expiry> is the end of the entry's queue lease (server
--            clock, ms), <ttl> the TTL a hand-off gives the lock (at most the
--            queue lease for a holder that renews, see fair_acquire.lua),
--            <fence_ttl> the TTL of the fencing counter it sets ('0':
--            unfenced), <route> the waiter's manager's hand-off tag (hex) and
--            <holder> the waiter's description
-- A member and its entry are written and removed together. Both keys get the
-- queue lease as TTL at every enqueue or refresh (every client passes the same
-- queue lease), so they outlive no entry's lease by more, and Redis deletes
-- each with its last member.
-- An entry whose queue lease has run out (a waiter that died) is dropped when
-- it reaches the head of the queue, so it never blocks the queue longer.
--
-- fair_hand_off gives the lock (free, or being released by its holder) to the
-- first live entry: it writes the lock in the owner's name
-- ("<owner>-<token>:<now>:<holder>", TTL <ttl>), removes the entry and publishes "=<owner>:<token>" on "<wake-up channel>:<route>",
-- which only the waiter's manager listens to, so that the waiter holds the
-- lock without another round trip, and no other manager hears of it.

-- The server clock: milliseconds and microseconds.
local function fair_clock()
  local t = redis.call('TIME')
  local us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  return math.floor(us / 1000), us
end

local function fair_drop(queue, entries, owner)
  if redis.call('ZREM', queue, owner) == 1 then
    redis.call('HDEL', entries, owner)
  end
end

-- The first entry whose queue lease runs: owner, ttl, fence_ttl, route,
-- holder; nil for none. Expired entries met on the way are dropped.
local function fair_head(queue, entries, now)
  while true do
    local first = redis.call('ZRANGE', queue, 0, 0)
    if #first == 0 then
      return nil
    end
    local owner = first[1]
    local entry = redis.call('HGET', entries, owner)
    if entry then
      local expiry, ttl, fence_ttl, route, holder =
        string.match(entry, '^(%d+):(%d+):(%d+):(%x*):(.*)$')
      if expiry and tonumber(expiry) > now then
        return owner, ttl, fence_ttl, route, holder
      end
    end
    fair_drop(queue, entries, owner)
  end
end

-- Adds `owner` at the end of the queue (or keeps its place: NX), and starts a
-- new queue lease for its entry.
local function fair_enqueue(queue, entries, owner, now, now_us, queue_lease, ttl, fence_ttl, route, holder)
  redis.call('ZADD', queue, 'NX', string.format('%.0f', now_us), owner)
  local expiry = now + tonumber(queue_lease)
  redis.call('HSET', entries, owner,
    string.format('%.0f', expiry) .. ':' .. ttl .. ':' .. fence_ttl .. ':' .. route .. ':' .. holder)
  redis.call('PEXPIRE', queue, queue_lease)
  redis.call('PEXPIRE', entries, queue_lease)
end

-- Gives the lock (free, or ours and being released: the SET overwrites it) to
-- the head of the queue; returns its owner, or nil when nobody waits.
local function fair_hand_off(lock, fence, queue, entries, channel, now)
  local owner, ttl, fence_ttl, route, holder = fair_head(queue, entries, now)
  if not owner then
    return nil
  end
  local token = next_token(fence, fence_ttl)
  local text = string.format('%.0f', token)
  redis.call('SET', lock, owner .. '-' .. text .. ':' .. string.format('%.0f', now) .. ':' .. holder,
    'PX', ttl)
  fair_drop(queue, entries, owner)
  redis.call('PUBLISH', channel .. ':' .. route, '=' .. owner .. ':' .. text)
  return owner
end

