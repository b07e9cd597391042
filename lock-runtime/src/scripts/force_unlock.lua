-- Free a lock whoever holds it (an operator's force-unlock), and wake its waiters.
--
-- KEYS[1]  lock: "<owner><mark><token>:<since>:<holder>" (see acquire.lua)
-- ARGV[1]  wake-up channel of the lock
-- ARGV[2]  a fresh random token, published as the wake-up's payload (a Redlock
--          manager hears one release from every member and wakes one waiter per
--          payload)
--
-- Returns {1, ARGV[2]}  the lock was held: it is deleted and a wake-up published
--         {0, ARGV[2]}  nobody held it
--
-- The holder is not told here: its next renewal finds the lock gone and reports
-- the lease lost, and its release reports `Lost`. The fencing counter stays, so the
-- next holder's token is still larger than the holder's.
if redis.call('DEL', KEYS[1]) == 1 then
  redis.call('PUBLISH', ARGV[1], ARGV[2])
  return {1, ARGV[2]}
end
return {0, ARGV[2]}
