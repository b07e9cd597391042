-- Shared by acquire.lua, acquire_all.lua and release.lua (prepended after
-- shared_prelude.lua): the queue of the default lock's waiters.
--
-- A lock's waiters queue in Redis, in arrival order:
--   queue    sorted set: owner token -> arrival time (server clock, in
--            microseconds: one script takes more than a microsecond, so no
--            two arrivals tie; a server clock stepped back by d puts arrivals
--            of the next d ahead of earlier ones: a question of order, never
--            of exclusion)
--   entries  hash: owner token ->
--            "<expiry>:<ttl>:<fence_ttl>:<route>:<attempt>:<holder>",
--            where <expiry> is the end of the entry's queue lease (server
--            clock, ms), <ttl> the TTL a hand-off gives the lock (at most the
--            queue lease for a holder that renews, see acquire.lua),
--            <fence_ttl> the TTL of the fencing counter a hand-off sets when
--            the waiter asked for its token eagerly ('0': no token now; it
--            asks later, with issue_token.lua), <route> the waiter's manager's
--            hand-off tag (hex), <attempt> the number of the waiter's attempt
--            that last refreshed the entry, and <holder> the waiter's
--            description
-- A member and its entry are written and removed together. Both keys get the
-- queue lease as TTL at every enqueue or refresh (every client passes the same
-- queue lease), so they outlive no entry's lease by more, and Redis deletes
-- each with its last member.
-- An entry whose queue lease has run out (a waiter that died) is dropped when
-- it reaches the head of the queue, so it never blocks the queue longer.
--
-- The lock's mark (the character after the owner token) is '+' while anyone
-- waits: a waiter sets it in the script that queues it up, and a hand-off
-- keeps it while others stay queued. A release reads the queue only for a
-- marked lock, so a lock nobody waited for costs its release a GET and a DEL.
--
-- queue_hand_off gives the lock (free, or being released by its holder) to
-- the first live entry: it writes the lock in the owner's name
-- ("<owner><mark><token>:<now>:<holder>", TTL <ttl>), removes the entry and
-- publishes "=<owner>:<token>:<attempt>" on "<hand-off base>:<route>" (the
-- base is
-- "<prefix>handoff"), the one channel of the waiter's manager for all its
-- locks, so that the waiter holds the lock without another round trip, no
-- other manager hears of it, and a manager waits on a new key without
-- subscribing to anything new. <attempt> names the attempt whose entry the
-- hand-off consumed: the lock's TTL runs from after that attempt was sent,
-- so the waiter counts its lease from then, not from a later attempt (a
-- hand-off heard late, after the waiter queued again, would otherwise be
-- trusted for longer than its TTL).

-- The server clock: milliseconds and microseconds.
local function queue_clock()
  local t = redis.call('TIME')
  local us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  return math.floor(us / 1000), us
end

-- Removes `owner`'s entry; true when it had one.
local function queue_drop(queue, entries, owner)
  if redis.call('ZREM', queue, owner) == 1 then
    redis.call('HDEL', entries, owner)
    return true
  end
  return false
end

-- The mark a lock written now gets when `others` entries (live or not) stay
-- queued: '+' while anyone is, '-' otherwise.
local function queue_mark(others)
  if others > 0 then
    return '+'
  end
  return '-'
end

-- The first entry whose queue lease runs: owner, ttl, fence_ttl, route,
-- holder, the server clock (ms), the attempt that last refreshed it, and the
-- mark a lock written for that owner gets once its entry is out (see
-- queue_mark); nil for none. Expired entries met on the way are dropped. The
-- server clock is read only when someone is queued. The queue's first two
-- members are read together: whether a second follows the head is the mark,
-- which saves the hand-off (and a scripted acquisition that finds itself at
-- the head) a ZCARD.
local function queue_head(queue, entries)
  local now = nil
  while true do
    local first = redis.call('ZRANGE', queue, 0, 1)
    if #first == 0 then
      return nil
    end
    if not now then
      now = queue_clock()
    end
    local owner = first[1]
    local entry = redis.call('HGET', entries, owner)
    if entry then
      local expiry, ttl, fence_ttl, route, attempt, holder =
        string.match(entry, '^(%d+):(%d+):(%d+):(%x*):(%d+):(.*)$')
      if expiry and tonumber(expiry) > now then
        return owner, ttl, fence_ttl, route, holder, now, attempt, queue_mark(#first - 1)
      end
    end
    queue_drop(queue, entries, owner)
  end
end


-- Adds `owner` at the end of the queue (or keeps its place: NX), and starts a
-- new queue lease for its entry.
local function queue_enqueue(queue, entries, owner, queue_lease, ttl, fence_ttl, route, attempt, holder)
  local now, now_us = queue_clock()
  redis.call('ZADD', queue, 'NX', string.format('%.0f', now_us), owner)
  local expiry = now + tonumber(queue_lease)
  redis.call('HSET', entries, owner,
    string.format('%.0f', expiry) .. ':' .. ttl .. ':' .. fence_ttl .. ':' .. route .. ':'
      .. attempt .. ':' .. holder)
  redis.call('PEXPIRE', queue, queue_lease)
  redis.call('PEXPIRE', entries, queue_lease)
end

-- Gives the lock (free, or ours and being released: the SET overwrites it) to
-- the head of the queue; returns its owner, or nil when nobody live waits.
-- With an events channel (not ''), publishes "handed-over <token> <since>
-- <holder>" on it.
local function queue_hand_off(lock, fence, queue, entries, handoff_base, events)
  local owner, ttl, fence_ttl, route, holder, now, attempt, mark = queue_head(queue, entries)
  if not owner then
    return nil
  end
  queue_drop(queue, entries, owner)
  local token = next_token(fence, fence_ttl)
  local text = string.format('%.0f', token)
  local since = string.format('%.0f', now)
  redis.call('SET', lock, owner .. mark .. text .. ':' .. since .. ':' .. holder, 'PX', ttl)
  redis.call('PUBLISH', handoff_base .. ':' .. route, '=' .. owner .. ':' .. text .. ':' .. attempt)
  if events and events ~= '' then
    redis.call('PUBLISH', events, 'handed-over ' .. text .. ' ' .. since .. ' ' .. holder)
  end
  return owner
end

