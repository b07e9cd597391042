-- Take a permit of a semaphore: when fewer than its permit count hold one.
--
-- KEYS[1]  holders: sorted set, owner token -> end of its lease (server ms);
--          its TTL is the end of the longest lease. A weighted hold's owner
--          token ends in ":<n>": it holds n permits (see weight_of)
-- KEYS[2]  fencing counter
-- KEYS[3]  permit count of the holders now in the set (TTL as KEYS[1])
-- KEYS[4]  holders' details: owner token -> "<token>:<since>:<holder>" (see
--          shared_prelude.lua), TTL as KEYS[1]; and field '?': the largest
--          weight a waiter was refused with or waits for (absent: 1), so that
--          a release wakes it once enough permits may be free (see
--          permit_release.lua). It goes with the hash, when the last holder
--          leaves.
-- ARGV[1..4]  owner, lease ms, fence TTL ('0': unfenced), '+' when the caller
--             waits for a wake-up ('-' otherwise): a refused weighted waiter
--             records its weight
-- ARGV[5]  the caller's permit count
-- ARGV[6]  '1' to replace a different stored count with ARGV[5] (an explicit
--          resize), '0' to refuse it
-- ARGV[7..8]  since ms, holder (as acquire.lua), for the details
-- ARGV[9]  (when ARGV[4] is '+') the most permits a waiter of the caller's
--          manager waits for, the caller's own included: recorded in '?'
--          whether or not the caller gets in, since the manager's other
--          waiters make no attempt until they are first in its line, and a
--          release must wake them once enough permits may be free. Absent: 1
--
-- Returns {1, token, owner, left}
--                             a permit is ours (a retry of ours keeps it and
--                             gets a fresh token), and `left` permits are
--                             still free: the caller's manager then wakes its
--                             next waiter, since a release wakes nobody when
--                             no waiter was kept out before it (see
--                             permit_release.lua)
--         {0, pttl, owner}    too few permits are free; the first holder to
--                             expire does so in `pttl` ms
--         {2, count, owner}   holders use the semaphore with `count` permits
--                             and the caller said otherwise without resizing
--         {3, 0, owner}       a name of the semaphore holds a value distlock
--                             did not write (another type or shape): nothing
--                             was changed
--
-- The count lives as long as the holders: with nobody holding, the next caller's
-- count stands. A resize changes nobody's hold: with fewer permits than
-- holders, nobody new enters until enough have left.
-- Raises '?' to `weight`; only into the holders' hash while it exists (it
-- has their TTL). PTTL tells that (-2: no key) where EXISTS would do, since
-- the least-privilege ACL has PTTL and not EXISTS.
local function record_waiting(weight)
  if ARGV[4] == '+' and weight > 1 and redis.call('PTTL', KEYS[4]) ~= -2 then
    local recorded = tonumber(redis.call('HGET', KEYS[4], '?')) or 1
    if weight > recorded then
      redis.call('HSET', KEYS[4], '?', weight)
    end
  end
end

local now = now_ms()
if type(redis.pcall('ZSCORE', KEYS[1], ARGV[1])) == 'table'
    or foreign_details(KEYS[4]) then
  return {3, 0, ARGV[1]}
end
drop_expired(KEYS[1], KEYS[4], now)
local holders = redis.call('ZCARD', KEYS[1])
local stored = redis.pcall('GET', KEYS[3])
if type(stored) == 'table' or (stored and not string.find(stored, '^%d+$')) then
  return {3, 0, ARGV[1]}
end
if holders > 0 and stored and stored ~= ARGV[5] and ARGV[6] ~= '1' then
  return {2, tonumber(stored), ARGV[1]}
end
-- Each holder stands for one permit or more, so ZCARD alone can rule a
-- request out; the exact sum reads every holder.
local wanted = weight_of(ARGV[1])
local waiting = math.max(wanted, tonumber(ARGV[9]) or 1)
local count = tonumber(ARGV[5])
local mine = redis.call('ZSCORE', KEYS[1], ARGV[1])
local held = nil
if mine or holders + wanted <= count then
  held = permits_held(KEYS[1])
end
if mine or (held and held + wanted <= count) then
  local token = next_token(KEYS[2], ARGV[3])
  redis.call('ZADD', KEYS[1], string.format('%.0f', now + tonumber(ARGV[2])), ARGV[1])
  describe(KEYS[4], ARGV[1], token, ARGV[7], ARGV[8])
  redis.call('SET', KEYS[3], ARGV[5])
  push_expiry(KEYS[1], KEYS[3], KEYS[4])
  record_waiting(waiting)
  -- `held` counts a hold of ours already: a retry replaces it.
  if not mine then
    held = held + wanted
  end
  return {1, token, ARGV[1], math.max(0, count - held)}
end
if ARGV[6] == '1' then
  redis.call('SET', KEYS[3], ARGV[5], 'KEEPTTL')
end
record_waiting(waiting)
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return {0, tonumber(first[2]) - now, ARGV[1]}
