-- Release the default lock if it is ours and nobody waited for it: the
-- common release, which touches the lock's own key alone. Everything else (a
-- lock someone queued for, a hold that is no longer ours, a value of another
-- type) is left for release.lua, which the client sends next.
--
-- KEYS[1]  lock (see acquire.lua)
-- ARGV[1]  claim: the owner token followed by '-', the lock value's prefix
--          while nobody waited for it (a waiter turns the '-' into '+')
-- KEYS[2]  this release's receipt, optional (Cluster and Sentinel, whose
--          clients send a call again when its connection broke before the
--          reply): set to ARGV[4] for ARGV[3] ms when the lock is released,
--          so that the release sent again (release.lua, after this script
--          declines) answers what this run did rather than "not ours"
-- ARGV[2]  events channel, optional (absent or '': a manager without lock
--          events): the release publishes "released <token>" on it
-- ARGV[3]  ms the receipt KEYS[2] is kept (with KEYS[2] only)
-- ARGV[4]  the release call's id, the receipt's value (with KEYS[2] only)
--
-- Returns claim  (a bulk string, echoing ARGV[1]) the lock was ours, nobody
--                waited for it, and it is deleted
--         0      nothing was done: send release.lua
--
-- Why a script of its own: a script declares every key it may touch, and
-- release.lua declares the queue's three (it hands the lock over), which costs
-- the server about 1.2 us per call of a 4-5 us acquire + release cycle. The
-- client sends this script first only for a hold that did not wait for the
-- lock (a waiter that got it usually has others behind it), so a hand-off
-- pays its extra round trip only when waiters came after a free acquisition
-- and the holder's manager did not hear the first one's notice (see
-- acquire.lua).
-- One test that the value starts with the claim tells both that the lock is
-- ours and that nobody marked it. A plain find anchored at the start makes
-- no string, where taking the value's prefix with string.sub makes (hashes,
-- interns and later collects) one: 330 fewer server instructions a cycle of
-- about 36,500 (lock-bench/server-instructions.sh distlock, before and
-- after). A value that does not start with the claim is searched to its end,
-- which only a release that will not happen pays.
local claim = ARGV[1]
local held = redis.pcall('GET', KEYS[1])
if type(held) == 'string' and string.find(held, claim, 1, true) == 1 then
  redis.call('DEL', KEYS[1])
  if KEYS[2] then
    redis.call('SET', KEYS[2], ARGV[4], 'PX', ARGV[3])
  end
  local events = ARGV[2]
  if events and events ~= '' then
    redis.call('PUBLISH', events,
      'released ' .. (string.match(held, '^%d+', #claim + 1) or '0'))
  end
  return claim
end
return 0
