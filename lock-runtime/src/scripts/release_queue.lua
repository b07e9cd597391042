-- The rest of release.lua (see its header): after the helpers, for a lock
-- someone waits for, a min_hold, or a lock that is not ours. `owner`,
-- `owner_len`, `held`, `foreign`, `ours` and `events` come from release.lua,
-- which runs first.

-- A lock's names are "<prefix>lock:<tail>" and "<prefix>lockq:<tail>" (tail:
-- "{tag}:key"): they first differ at the character after "lock", which ends
-- the prefix. Derived here rather than sent, so that the common release (the
-- fast path above) carries one argument.
local function lock_prefix_and_tail(lock, queue)
  local i = 1
  while i <= #lock and string.byte(lock, i) == string.byte(queue, i) do
    i = i + 1
  end
  return string.sub(lock, 1, i - 5), string.sub(lock, i + 1)
end

local prefix, tail = lock_prefix_and_tail(KEYS[1], KEYS[3])
local handoff_base = prefix .. 'handoff'
if ours then
  if KEYS[5] then
    redis.call('SET', KEYS[5], ARGV[6], 'PX', ARGV[5])
  end
  local keep_ms = tonumber(ARGV[2]) or 0
  if keep_ms > 0 then
    redis.call('PEXPIRE', KEYS[1], keep_ms)
    return owner
  end
  -- A hand-off overwrites the lock; with nobody queued, it goes, and waiters
  -- that do not queue hear of it.
  if not queue_hand_off(KEYS[1], KEYS[2], KEYS[3], KEYS[4], handoff_base, events) then
    redis.call('DEL', KEYS[1])
    redis.call('PUBLISH', prefix .. 'wake:' .. tail, owner .. (ARGV[4] or ''))
    if events ~= '' then
      redis.call('PUBLISH', events, 'released ' .. (string.match(held, '^%d+', owner_len + 2) or '0'))
    end
  end
  return owner
end
-- This release sent again after its reply was lost: its first run found the
-- lock ours and did the rest (queue entry included).
if KEYS[5] and redis.call('GET', KEYS[5]) == ARGV[6] then
  return owner
end
queue_drop(KEYS[3], KEYS[4], owner)
-- A free lock goes to the head; a value of another type stays (a hand-off
-- would overwrite it).
if not held and not foreign then
  queue_hand_off(KEYS[1], KEYS[2], KEYS[3], KEYS[4], handoff_base, events)
end
return {0, owner}
