-- Read every hold on one user key for an operator, of every kind, with the
-- default lock's queue: one consistent snapshot.
--
-- KEYS[1]  lock: "<owner><mark><token>:<since>:<holder>" (see acquire.lua)
-- KEYS[2]  the lock's queue, KEYS[3] its entries (see queue_prelude.lua)
-- KEYS[4]  read-write lock's writer (the lock's format)
-- KEYS[5]  its readers, KEYS[6] their details (see read_acquire.lua)
-- KEYS[7]  its writer intent (see write_acquire.lua)
-- KEYS[8]  semaphore holders, KEYS[9] their details, KEYS[10] its permit
--          count (see permit_acquire.lua)
-- KEYS[11] counting semaphore's counter, KEYS[12] its waiters (see
--          counter_acquire.lua)
--
-- Returns {1, lock, lock_pttl, queue, writer, writer_pttl, readers,
--          intent_pttl, permits, count, now, counter, counter_waiters}
--   lock, writer   the stored value, or false when nobody holds it
--   *_pttl         the name's PTTL (-2: no such key, -1: no TTL)
--   queue          {owner, entry, ...} in arrival order (entries as
--                  queue_prelude.lua writes them; false when missing)
--   readers, permits  {member, lease end (server ms), details or false, ...}
--                  of the holders whose lease has not ended, the lease that
--                  ends soonest first
--   count          the stored permit count, or false
--   now            the server clock, ms
--   counter        the counting semaphore's available permits (decimal
--                  string), or false when it does not exist
--   counter_waiters  its registrations that have not ended
--         {3}  a name holds a value of another type than distlock writes
--              there
-- Reads only: expired holders are left for the next acquisition to remove.
local now = now_ms()
local function string_at(name)
  local value = redis.pcall('GET', name)
  if type(value) == 'table' then
    return nil
  end
  return value
end
local function holders_of(set, details)
  local members = live_members(set, now)
  if members.err then
    return nil
  end
  local out = {}
  for i = 1, #members, 2 do
    local described = redis.pcall('HGET', details, members[i])
    if type(described) == 'table' then
      return nil
    end
    out[#out + 1] = members[i]
    out[#out + 1] = members[i + 1]
    out[#out + 1] = described
  end
  return out
end
local lock = string_at(KEYS[1])
local writer = string_at(KEYS[4])
local count = string_at(KEYS[10])
local readers = holders_of(KEYS[5], KEYS[6])
local permits = holders_of(KEYS[8], KEYS[9])
local waiting = redis.pcall('ZRANGE', KEYS[2], 0, -1)
local counter = string_at(KEYS[11])
if counter and counter ~= '0' and not string.find(counter, '^%-?[1-9]%d*$') then
  counter = nil
end
-- The live registrations: ZRANGE BYSCORE where ZCOUNT would do, since the
-- least-privilege ACL has ZRANGE and not ZCOUNT (a counter's waiters are
-- few).
local counter_waiters = redis.pcall('ZRANGE', KEYS[12], '(' .. string.format('%.0f', now), '+inf', 'BYSCORE')
if type(counter_waiters) == 'table' and not counter_waiters.err then
  counter_waiters = #counter_waiters
end
if lock == nil or writer == nil or count == nil or readers == nil or permits == nil
    or waiting.err or foreign_details(KEYS[6]) or foreign_details(KEYS[9])
    or counter == nil or type(counter_waiters) == 'table' then
  return {3}
end
local queue = {}
for _, owner in ipairs(waiting) do
  local entry = redis.pcall('HGET', KEYS[3], owner)
  if type(entry) == 'table' then
    return {3}
  end
  queue[#queue + 1] = owner
  queue[#queue + 1] = entry
end
return {1, lock, redis.call('PTTL', KEYS[1]), queue, writer, redis.call('PTTL', KEYS[4]),
  readers, redis.call('PTTL', KEYS[7]), permits, count, now, counter, counter_waiters}
