-- Release the default lock if it is ours and nobody waited for it: the
-- common release, which touches the lock's own key alone. Everything else (a
-- lock someone queued for, a hold that is no longer ours, a value of another
-- type) is left for release.lua, which the client sends next.
--
-- KEYS[1]  lock (see acquire.lua)
-- ARGV[1]  owner token
-- ARGV[2]  events channel, optional (absent or '': a manager without lock
--          events): the release publishes "released <token>" on it
--
-- Returns owner  (a bulk string, echoing ARGV[1]) the lock was ours, nobody
--                waited for it, and it is deleted
--         0      nothing was done: send release.lua
--
-- Why a script of its own: a script declares every key it may touch, and
-- release.lua declares the queue's three (it hands the lock over), which costs
-- the server about 1.2 us per call of a 4-5 us acquire + release cycle. The
-- client sends this script first only for a hold that did not wait for the
-- lock (a waiter that got it usually has others behind it), so a hand-off
-- pays its extra round trip only when waiters came after a free acquisition.
local owner = ARGV[1]
local held = redis.pcall('GET', KEYS[1])
-- The byte after the owner token is the waited-for mark: '+' (43) once a
-- waiter queued. string.find from the first byte and string.byte make no new
-- Lua string.
if type(held) == 'string' and string.find(held, owner, 1, true) == 1
    and string.byte(held, string.len(owner) + 1) ~= 43 then
  redis.call('DEL', KEYS[1])
  local events = ARGV[2] or ''
  if events ~= '' then
    redis.call('PUBLISH', events,
      'released ' .. (string.match(held, '^%d+', string.len(owner) + 2) or '0'))
  end
  return owner
end
return 0
