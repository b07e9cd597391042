-- Free a read-write lock's or a semaphore's holds whoever holds them (an
-- operator's force-unlock): all of them, or one holder's. Waiters are told as
-- a release tells them.
--
-- KEYS[1]  read-write lock's writer (see write_acquire.lua)
-- KEYS[2]  its readers, KEYS[3] their details (see read_acquire.lua)
-- KEYS[4]  its writer intent
-- KEYS[8]  this call's receipt (see force_unlock.lua)
-- KEYS[5]  semaphore holders, KEYS[6] their details, KEYS[7] its permit
--          count (see permit_acquire.lua)
-- ARGV[1]  the read-write lock's wake-up channel
-- ARGV[2]  the semaphore's wake-up channel
-- ARGV[3]  a fresh random token, the wake-ups' payload (after a '*' on the
--          read-write lock's channel, which wakes every waiter there; after
--          "#<n>:" on the semaphore's, which gives n wake-ups, n the permits
--          freed, see permit_release.lua)
-- ARGV[4]  what to free: 'all' (every hold of both kinds, and the writer's
--          intent), 'write', 'read' or 'permit' (one holder's)
-- ARGV[5]  the holder's owner token (a semaphore holder's member: its owner
--          token, with ':<n>' for a hold of n permits), for one holder
--
-- ARGV[6]  ms the receipt is kept ('0': none)
--
-- Returns {freed, token}  how many holds were freed (0: none matched), and
--                         ARGV[3] echoed
--
-- Bound: at most one PUBLISH per channel, whatever the weights freed; the
-- other work reads the live holders once each.
--
-- The holders are not told here: each learns it at its next renewal. The
-- fencing counters stay, so later tokens are still larger.
local receipt_ms = ARGV[6] or '0'
if receipt_ms ~= '0' then
  local done = redis.call('GET', KEYS[8])
  if done then
    return {tonumber(done), ARGV[3]}
  end
end
local now = now_ms()
local mode = ARGV[4]
local owner = ARGV[5] or ''
local rw_freed, permits_freed, freed = false, 0, 0
-- Removes `member` from holders' set `set` and its details, when it holds
-- a live lease there; `...`: the set's other names, whose TTL follows it.
local function free_member(set, details, member, ...)
  local score = redis.pcall('ZSCORE', set, member)
  if type(score) ~= 'string' or tonumber(score) <= now or foreign_details(details) then
    return false
  end
  redis.call('ZREM', set, member)
  redis.call('HDEL', details, member)
  push_expiry(set, details, ...)
  return true
end
if mode == 'all' then
  local writer = redis.pcall('GET', KEYS[1])
  if type(writer) == 'string' and is_lock_value(writer) then
    redis.call('DEL', KEYS[1])
    freed = freed + 1
    rw_freed = true
  end
  local readers = live_members(KEYS[2], now)
  if not readers.err and #readers > 0 then
    freed = freed + #readers / 2
    rw_freed = true
  end
  if not readers.err and not foreign_details(KEYS[3]) then
    redis.call('DEL', KEYS[2], KEYS[3])
    local intent = redis.pcall('GET', KEYS[4])
    if type(intent) == 'string' then
      redis.call('DEL', KEYS[4])
    end
  end
  local holders = live_members(KEYS[5], now)
  local count = redis.pcall('GET', KEYS[7])
  local foreign_count = type(count) == 'table' or (count and not string.find(count, '^%d+$'))
  if not holders.err and not foreign_details(KEYS[6]) and not foreign_count then
    for i = 1, #holders, 2 do
      freed = freed + 1
      permits_freed = permits_freed + weight_of(holders[i])
    end
    redis.call('DEL', KEYS[5], KEYS[6], KEYS[7])
  end
elseif mode == 'write' then
  local writer = redis.pcall('GET', KEYS[1])
  if type(writer) == 'string' and string.sub(writer, 1, string.len(owner)) == owner
      and is_lock_value(writer) then
    redis.call('DEL', KEYS[1])
    freed = 1
    rw_freed = true
  end
elseif mode == 'read' then
  if free_member(KEYS[2], KEYS[3], owner) then
    freed = 1
    rw_freed = true
  end
elseif mode == 'permit' then
  if free_member(KEYS[5], KEYS[6], owner, KEYS[7]) then
    freed = 1
    permits_freed = weight_of(owner)
  end
end
if rw_freed then
  redis.call('PUBLISH', ARGV[1], '*' .. ARGV[3])
end
if permits_freed > 0 then
  redis.call('PUBLISH', ARGV[2], '#' .. string.format('%.0f', permits_freed) .. ':' .. ARGV[3])
end
if receipt_ms ~= '0' then
  redis.call('SET', KEYS[8], string.format('%.0f', freed), 'PX', receipt_ms)
end
return {freed, ARGV[3]}
