-- Release the default lock if it is ours: delete it, or hand it to the first
-- live waiter in its queue; withdraw our queue entry if we left one (a waiter
-- that gave up); or, for a request's min_hold, keep it a while longer.
--
-- KEYS[1]  lock (see acquire.lua)
-- KEYS[2]  fencing counter
-- KEYS[3]  queue
-- KEYS[4]  queue entries
-- ARGV[1]  owner token
-- ARGV[2]  wake-up channel: a release of a marked lock that nobody is queued
--          for publishes the owner token on it, for waiters that do not queue
--          (multi-key, Redlock)
-- ARGV[3]  keep_ms: above 0, the rest of a min_hold: the lock is kept that
--          long instead of released (the head takes it when it has expired,
--          at its next attempt or any other caller's)
-- ARGV[4]  hand-off base ("<prefix>handoff"): a hand-off publishes on
--          "<base>:<route of the new holder>" (see queue_prelude.lua)
-- ARGV[5]  events channel, or '' for a manager without lock events: a
--          release that deletes the lock publishes "released <token>" on it,
--          a hand-off "handed-over ..." (queue_prelude.lua)
--
-- Returns {1, owner}  the lock was ours and is deleted, handed off or kept
--         {0, owner}  it was not ours (our lease ran out, or we never held
--                     it: the release only withdrew our queue entry)
-- `owner` echoes ARGV[1], so the client can tell that a reply is the one to its
-- own request.
--
-- A lock nobody waited for (mark '-') costs GET and DEL: the queue is not
-- read, and the client sends this file's fast path before the helpers
-- (shared_prelude.lua, queue_prelude.lua) and the rest (release_queue.lua), so
-- that such a release defines no function either. A withdrawal that finds
-- the lock free hands it off, so a cancelled head does not hold up the next
-- waiter. A value of another type under the
-- lock's name is not ours and is left as it is.
local owner = ARGV[1]
local owner_len = string.len(owner)
local events = ARGV[5] or ''
local held = redis.pcall('GET', KEYS[1])
if type(held) == 'table' then
  held = false
end
local ours = held and string.sub(held, 1, owner_len) == owner
-- The fast path, before the helpers are defined (each call of a script runs
-- its definitions): a lock of ours that nobody waited for, and no min_hold.
if ours and string.sub(held, owner_len + 1, owner_len + 1) ~= '+' and (tonumber(ARGV[3]) or 0) <= 0 then
  redis.call('DEL', KEYS[1])
  if events ~= '' then
    redis.call('PUBLISH', events, 'released ' .. (string.match(held, '^%d+', owner_len + 2) or '0'))
  end
  return {1, owner}
end
