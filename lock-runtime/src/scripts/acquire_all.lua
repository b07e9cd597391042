-- Acquire several locks at once, all or none, and issue a fencing token for each.
--
-- Every lock is taken exactly as acquire.lua takes one (same value, same lease,
-- same fencing counter, so `lock(k)` and a multi-key lock on k exclude each
-- other), but only when all of them can be: the script first checks every lock
-- and, if one is held by another owner, takes none (nothing is written, so
-- there is nothing to undo and no fencing token is spent).
--
-- Loops twice over the locks it was sent; the client sends at most
-- MAX_LOCK_ALL_KEYS (multi.rs) of them, which bounds its time.
--
-- Only for keys on one server: in Redis Cluster every key of a script must hash
-- to one slot, and distinct locks do not (the manager takes them one by one there).
--
-- KEYS[2i-1]  lock i: "<owner><mark><token>:<since>:<holder>" (see acquire.lua)
-- KEYS[2i]    fencing counter of lock i (see acquire.lua)
-- ARGV[1]     owner token (random, 32 hex digits), the same for every lock
-- ARGV[2]     lease in milliseconds
-- ARGV[3]     TTL of the fencing counters in milliseconds (lease + retention); '0'
--             for a manager without fencing: tokens are 0, counters untouched
-- ARGV[4]     <since>: acquisition time, client clock, ms since the Unix epoch
-- ARGV[5]     <holder>: the holder's description
-- ARGV[5+i]   (optional) events channel of lock i: a lock taken afresh
--             publishes "acquired <token> <since> <holder>" on it (see
--             acquire.lua); absent or '' for a manager without lock events
--
-- Returns {1, owner, token_1, ..., token_n}  every lock is ours, with these fencing
--                                            tokens (in KEYS order): freshly taken,
--                                            or already ours (a retried call whose
--                                            first reply was lost); every lease is
--                                            reset to ARGV[2]
--         {0, owner, i, pttl}                lock i (1-based) is held by another owner
--                                            for `pttl` more milliseconds (-1: no TTL);
--                                            nothing was written
--         {3, owner, i}                      lock i holds a value distlock did not
--                                            write: nothing was written
-- `owner` echoes ARGV[1], so the client can tell that a reply is the one to its
-- own request. New locks are unmarked ('-'): the caller does not wait inside this
-- script (a caller that has to wait takes the locks one by one with acquire.lua).
local n = #KEYS / 2
local owner = ARGV[1]
local owner_len = string.len(owner)

-- First pass: read every lock; stop at the first one held by another owner.
local held = {}
for i = 1, n do
  local value = redis.pcall('GET', KEYS[2 * i - 1])
  if type(value) == 'table' or (value and not is_lock_value(value)) then
    return {3, owner, i}
  end
  if value and string.sub(value, 1, owner_len) ~= owner then
    return {0, owner, i, redis.call('PTTL', KEYS[2 * i - 1])}
  end
  held[i] = value
end

-- Second pass: all free (or ours): take them.
local reply = {1, owner}
for i = 1, n do
  local lock = KEYS[2 * i - 1]
  if held[i] then
    redis.call('PEXPIRE', lock, ARGV[2])
    reply[i + 2] = tonumber(string.match(held[i], '^%d+', owner_len + 2)) or 0
  else
    -- 0 without fencing (ARGV[3] '0'), the counter untouched.
    local token = next_token(KEYS[2 * i], ARGV[3])
    -- '%.0f' writes the whole number in full; the default conversion may use an exponent.
    local text = string.format('%.0f', token)
    redis.call('SET', lock, owner .. '-' .. text .. ':' .. ARGV[4] .. ':' .. ARGV[5], 'PX', ARGV[2])
    local events = ARGV[5 + i]
    if events and events ~= '' then
      redis.call('PUBLISH', events, 'acquired ' .. text .. ' ' .. ARGV[4] .. ' ' .. ARGV[5])
    end
    reply[i + 2] = token
  end
end
return reply
