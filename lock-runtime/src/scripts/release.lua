-- Release the default lock if it is ours: delete it, or hand it to the first
-- live waiter in its queue; withdraw our queue entry if we left one (a waiter
-- that gave up); or, for a request's min_hold, keep it a while longer.
--
-- KEYS[1]  lock (see acquire.lua)
-- KEYS[2]  fencing counter
-- KEYS[3]  queue
-- KEYS[4]  queue entries
-- KEYS[5]  this release's receipt, optional (Cluster and Sentinel, whose
--          clients send a call again when its connection broke before the
--          reply): set to ARGV[6] for ARGV[5] ms when the lock was ours, so
--          that the release sent again, which finds the lock gone or handed
--          over, answers what the first run did rather than "not ours"
-- ARGV[1]  owner token
-- ARGV[2]  keep_ms, optional (absent: 0): above 0, the rest of a min_hold:
--          the lock is kept that long instead of released (the head takes it
--          when it has expired, at its next attempt or any other caller's)
-- ARGV[3]  events channel, optional (absent or '': a manager without lock
--          events): a release that deletes the lock publishes
--          "released <token>" on it, a hand-off "handed-over ..."
--          (queue_prelude.lua)
-- ARGV[4]  '~', optional: a give-back, not a release of a hold (an
--          acquisition returns a grant it cannot use, and its owner token
--          may hold the lock later): its wake-up is "<owner>~" instead of
--          "<owner>", so that a manager that drops copies of one release by
--          payload (several Redlock members, or a cluster's nodes, publish
--          each) does not take the owner's real release for a copy of it;
--          '' for a release (with ARGV[5])
-- ARGV[5]  ms the receipt KEYS[5] is kept (with KEYS[5] only)
-- ARGV[6]  the release call's id, the receipt's value (with KEYS[5] only):
--          another release by the same owner token (a second guard resumed
--          from one ticket) is not this one, and finds the hold not ours
-- The wake-up channel (for waiters that do not queue: multi-key, Redlock)
-- and the hand-off base ("<prefix>handoff", see queue_prelude.lua) are not
-- arguments: the slow path derives them from KEYS[1] and KEYS[3], which share
-- the lock's prefix and "{tag}:key" tail. Every argument sent costs the
-- server an object and a Lua string per call, and this script runs once per
-- lock held.
--
-- Returns owner       (a bulk string, echoing ARGV[1]) the lock was ours and is
--                     deleted, handed off or kept (or, with a receipt, an
--                     earlier run of this release found it so)
--         {0, owner}  it was not ours (our lease ran out, or we never held
--                     it: the release only withdrew our queue entry)
-- The echo lets the client tell that a reply is the one to its own request;
-- the common reply is one string rather than an array, which the server
-- builds with less work.
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
local events = ARGV[3] or ''
local held = redis.pcall('GET', KEYS[1])
-- Another type answers GET with an error: not ours, and not free either.
local foreign = type(held) == 'table'
if type(held) ~= 'string' then
  held = false
end
-- string.find from the first byte and string.byte make no new Lua string (a
-- string.sub would, at every release): about 0.2 us of server CPU per call.
local ours = held and string.find(held, owner, 1, true) == 1
-- The fast path, before the helpers are defined (each call of a script runs
-- its definitions): a lock of ours that nobody waited for (its mark, the byte
-- after the owner token, is not '+', 43), and no min_hold.
if ours and string.byte(held, owner_len + 1) ~= 43
    and (ARGV[2] == nil or (tonumber(ARGV[2]) or 0) <= 0) then
  redis.call('DEL', KEYS[1])
  if KEYS[5] then
    redis.call('SET', KEYS[5], ARGV[6], 'PX', ARGV[5])
  end
  if events ~= '' then
    redis.call('PUBLISH', events, 'released ' .. (string.match(held, '^%d+', owner_len + 2) or '0'))
  end
  return owner
end
