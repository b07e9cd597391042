-- Release a lock if it is still ours, and wake the waiters if anyone waits; or,
-- for a request's min_hold, keep it a while longer.
--
-- KEYS[1]  lock: "<owner><mark><token>:<since>:<holder>" (see acquire.lua)
-- ARGV[1]  owner token
-- ARGV[2]  wake-up channel of the lock
-- ARGV[3]  keep_ms: 0 to delete the lock; above 0, the milliseconds of the
--          request's min_hold still to run: the lock's TTL is set to that and
--          the lock stays (see below)
--
-- Returns {1, owner}  the lock was ours: it is deleted, and a wake-up is
--                     published if a waiter marked it ('+'); or, with keep_ms
--                     above 0, it expires in keep_ms milliseconds
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
-- A kept lock publishes nothing, now or when it expires: its waiters are not
-- woken early, and take it when their backoff (capped by the remaining lease
-- each last read) runs out after it expired.
local held = redis.call('GET', KEYS[1])
local owner_len = string.len(ARGV[1])
if held and string.sub(held, 1, owner_len) == ARGV[1] then
  local keep_ms = tonumber(ARGV[3]) or 0
  if keep_ms > 0 then
    redis.call('PEXPIRE', KEYS[1], keep_ms)
    return {1, ARGV[1]}
  end
  redis.call('DEL', KEYS[1])
  if string.sub(held, owner_len + 1, owner_len + 1) == '+' then
    redis.call('PUBLISH', ARGV[2], ARGV[1])
  end
  return {1, ARGV[1]}
end
return {0, ARGV[1]}
