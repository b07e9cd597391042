-- Acquire several locks at once, all or none, and issue a fencing token for each.
--
-- Every lock is taken exactly as acquire.lua takes one (same value, same lease,
-- same fencing counter, same queue, so `lock(k)` and a multi-key lock on k
-- exclude each other and a multi-key lock does not overtake k's waiters), but
-- only when all of them can be: the script first checks every lock and, if one
-- is held by another owner, takes none (none of the caller's is written, so
-- there is nothing to undo and no fencing token is spent).
--
-- A free lock whose queue has a live head other than the caller (its holder's
-- lease ran out, nobody released it) is busy: it is handed to that head here,
-- as acquire.lua does, rather than taken past it (the caller, which does not
-- queue in this script, would also leave the lock unmarked, so its release
-- would not hand it over and the head would wait for its next attempt).
--
-- Loops twice over the locks it was sent; the client sends at most
-- MAX_LOCK_ALL_KEYS (multi.rs) of them, which bounds its time.
--
-- Only for keys on one server: in Redis Cluster every key of a script must hash
-- to one slot, and distinct locks do not (the manager takes them one by one there).
--
-- KEYS[4i-3]  lock i: "<owner><mark><token>:<since>:<holder>" (see acquire.lua)
-- KEYS[4i-2]  fencing counter of lock i (see acquire.lua)
-- KEYS[4i-1]  queue of lock i (see queue_prelude.lua)
-- KEYS[4i]    queue entries of lock i (see queue_prelude.lua)
-- ARGV[1]     owner token (random, 32 hex digits), the same for every lock
-- ARGV[2]     lease in milliseconds
-- ARGV[3]     TTL of the fencing counters in milliseconds (lease + retention); '0'
--             for a manager without fencing: tokens are 0, counters untouched
-- ARGV[4]     <since>: acquisition time, client clock, ms since the Unix epoch
-- ARGV[5]     <holder>: the holder's description
-- ARGV[6]     hand-off base ("<prefix>handoff"), for a hand-off to a queue's
--             head (see queue_hand_off)
-- ARGV[6+i]   (optional) events channel of lock i: a lock taken afresh
--             publishes "acquired <token> <since> <holder>" on it (see
--             acquire.lua), a hand-off "handed-over ..."; absent or '' for a
--             manager without lock events
--
-- Returns {1, owner, token_1, ..., token_n}  every lock is ours, with these fencing
--                                            tokens (in KEYS order): freshly taken,
--                                            or already ours (a retried call whose
--                                            first reply was lost); every lease is
--                                            reset to ARGV[2]
--         {0, owner, i, pttl}                lock i (1-based) is held by another owner
--                                            for `pttl` more milliseconds (-1: no TTL),
--                                            or was just handed to its queue's head;
--                                            none of the caller's was written
--         {3, owner, i}                      lock i holds a value distlock did not
--                                            write: none of the caller's was written
-- `owner` echoes ARGV[1], so the client can tell that a reply is the one to its
-- own request. New locks are unmarked ('-'): the caller does not wait inside
-- this script (a caller that has to wait takes the locks one by one with
-- acquire.lua, under other owner tokens). The caller's own entry heading a
-- queue cannot happen today (a call's owner token is new and never queued);
-- were it to, the lock is taken as acquire.lua takes it then (the entry
-- dropped, the lock marked while others stay queued).
local n = #KEYS / 4
local owner = ARGV[1]
local owner_len = string.len(owner)

-- First pass: read every lock; stop at the first one held by another owner,
-- or free with another owner at the head of its queue.
local held = {}
local marks = {}
local ours_queued = {}
for i = 1, n do
  local lock = KEYS[4 * i - 3]
  local value = redis.pcall('GET', lock)
  if type(value) == 'table' or (value and not is_lock_value(value)) then
    return {3, owner, i}
  end
  if value and string.sub(value, 1, owner_len) ~= owner then
    return {0, owner, i, redis.call('PTTL', lock)}
  end
  if not value then
    local head, _, _, _, _, _, _, head_mark = queue_head(KEYS[4 * i - 1], KEYS[4 * i])
    if head and head ~= owner then
      queue_hand_off(lock, KEYS[4 * i - 2], KEYS[4 * i - 1], KEYS[4 * i], ARGV[6], ARGV[6 + i])
      return {0, owner, i, redis.call('PTTL', lock)}
    end
    marks[i] = head_mark or '-'
    ours_queued[i] = head == owner
  end
  held[i] = value
end

-- Second pass: all free (or ours): take them.
local reply = {1, owner}
for i = 1, n do
  local lock = KEYS[4 * i - 3]
  if held[i] then
    redis.call('PEXPIRE', lock, ARGV[2])
    reply[i + 2] = tonumber(string.match(held[i], '^%d+', owner_len + 2)) or 0
  else
    if ours_queued[i] then
      queue_drop(KEYS[4 * i - 1], KEYS[4 * i], owner)
    end
    -- 0 without fencing (ARGV[3] '0'), the counter untouched.
    local token = next_token(KEYS[4 * i - 2], ARGV[3])
    -- '%.0f' writes the whole number in full; the default conversion may use an exponent.
    local text = string.format('%.0f', token)
    redis.call('SET', lock, owner .. marks[i] .. text .. ':' .. ARGV[4] .. ':' .. ARGV[5], 'PX', ARGV[2])
    local events = ARGV[6 + i]
    if events and events ~= '' then
      redis.call('PUBLISH', events, 'acquired ' .. text .. ' ' .. ARGV[4] .. ' ' .. ARGV[5])
    end
    reply[i + 2] = token
  end
end
return reply
