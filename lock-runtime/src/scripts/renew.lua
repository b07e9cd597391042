-- Reset the lease of a lock if it is still ours.
--
-- KEYS[1]  lock hash {owner token -> fencing token}
-- ARGV[1]  owner token
-- ARGV[2]  lease in milliseconds
--
-- Returns 1  the lock is ours: its TTL is ARGV[2] again
--         0  the lock is gone or held by another owner: nothing changed, and
--            the holder has lost it
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
