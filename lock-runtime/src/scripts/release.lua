-- Release a lock if it is still ours, and wake the waiters.
--
-- KEYS[1]  lock hash {owner token -> fencing token}
-- ARGV[1]  owner token
-- ARGV[2]  wake-up channel of the lock
--
-- Returns {1, owner}  the lock was ours: it is deleted and a wake-up is published
--         {0, owner}  the lock is gone or held by another owner: nothing changed
--                     (our lease had run out).
--
-- `owner` echoes ARGV[1], so the client can tell that a reply is the one to its
-- own request.
--
-- The wake-up's payload is the releasing owner token: a Redlock manager hears one
-- release from every member that held the lock, and wakes one waiter per release,
-- not one per member. The token is dead once published (the lock is gone).
--
-- The wake-up is published on every release, also when nobody waits: a PUBLISH
-- to a channel without subscribers costs about a microsecond of Redis CPU, and
-- publishing only to locks marked as waited for let waiters of another manager
-- (or of an older version of this library) sleep through releases.
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], ARGV[1])
  return {1, ARGV[1]}
end
return {0, ARGV[1]}
