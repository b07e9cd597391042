-- Release a lock if it is still ours, and wake the waiters if there are any.
--
-- KEYS[1]  lock hash {owner token -> fencing token}, plus the field 'waiters' once
--          someone waits for it (see acquire.lua)
-- ARGV[1]  owner token
-- ARGV[2]  wake-up channel of the lock
--
-- Returns {1, owner}  the lock was ours: it is deleted, and a wake-up is published
--                     when it was marked as waited for
--         {0, owner}  the lock is gone or held by another owner: nothing changed
--                     (our lease had run out).
--
-- `owner` echoes ARGV[1], so the client can tell that a reply is the one to its
-- own request.
local state = redis.call('HMGET', KEYS[1], ARGV[1], 'waiters')
if state[1] then
  redis.call('DEL', KEYS[1])
  if state[2] then
    redis.call('PUBLISH', ARGV[2], 'released')
  end
  return {1, ARGV[1]}
end
return {0, ARGV[1]}
