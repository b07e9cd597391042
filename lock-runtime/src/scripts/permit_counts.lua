-- Count a semaphore's permits for an operator or a caller: how many are held
-- now, and the permit count its holders use.
--
-- KEYS[1]  holders (see permit_acquire.lua)
-- KEYS[2]  permit count
-- KEYS[3]  holders' details (see permit_acquire.lua)
--
-- Returns {held, count}  permits held by unexpired holders, and the stored
--                        permit count (-1 when nobody holds one: the count
--                        lives as long as the holders)
--         {-2, 0}        a name of the semaphore holds a value distlock did
--                        not write
--
-- Expired holders are removed first (with their details), as an acquisition
-- removes them, with the commands a semaphore's ACL already allows.
local now = now_ms()
if type(redis.pcall('ZCARD', KEYS[1])) == 'table'
    or foreign_details(KEYS[3]) then
  return {-2, 0}
end
drop_expired(KEYS[1], KEYS[3], now)
local held = permits_held(KEYS[1])
local stored = redis.pcall('GET', KEYS[2])
if type(stored) == 'table' or (stored and not string.find(stored, '^%d+$')) then
  return {-2, 0}
end
if held == 0 or not stored then
  return {held, -1}
end
return {held, tonumber(stored)}
