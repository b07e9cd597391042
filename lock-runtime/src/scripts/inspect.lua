-- Read a lock for an operator: its value and its remaining lease, together.
--
-- KEYS[1]  lock: "<owner><mark><token>:<since>:<holder>" (see acquire.lua)
--
-- Returns {value, pttl}  the lock is held; pttl is -1 when it has no TTL
--         {}             nobody holds it
local held = redis.call('GET', KEYS[1])
if held then
  return {held, redis.call('PTTL', KEYS[1])}
end
return {}
