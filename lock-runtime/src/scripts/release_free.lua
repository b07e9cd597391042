-- Release the default lock if it is ours and nobody waited for it: the
-- common release, which touches the lock's own key alone. Everything else (a
-- lock someone queued for, a hold that is no longer ours, a value of another
-- type) is left for release.lua, which the client sends next.
--
-- KEYS[1]  lock (see acquire.lua)
-- ARGV[1]  the lock's whole value as the hold wrote it while nobody waited
--          for it: "<owner>-<token>:<since>:<holder>" (a waiter turns the '-'
--          into '+'; a token issued later is in it)
-- ARGV[2]  events channel, optional (absent or '': a manager without lock
--          events): the release publishes "released <token>" on it
--
-- Returns value  (a bulk string, echoing ARGV[1]) the lock was ours, nobody
--                waited for it, and it is deleted
--         0      nothing was done: send release.lua
--
-- Why a script of its own: a script declares every key it may touch, and
-- release.lua declares the queue's three (it hands the lock over), which costs
-- the server about 1.2 us per call of a 4-5 us acquire + release cycle. The
-- client sends this script first only for a hold that did not wait for the
-- lock (a waiter that got it usually has others behind it), so a hand-off
-- pays its extra round trip only when waiters came after a free acquisition.
-- One comparison of the whole value tells both that the lock is ours and
-- that nobody marked it: Lua interns strings, so the value read is the very
-- string of ARGV[1] and the comparison is one pointer test, about 0.15 us a
-- call less than comparing a prefix (a new string per call). A value that
-- differs in any other part (a token issued whose reply the holder never
-- read) only sends the client on to release.lua.
local value = ARGV[1]
if redis.pcall('GET', KEYS[1]) == value then
  redis.call('DEL', KEYS[1])
  local events = ARGV[2]
  if events and events ~= '' then
    local token = string.match(value, '^[^-]*%-(%d+):')
    redis.call('PUBLISH', events, 'released ' .. (token or '0'))
  end
  return value
end
return 0
