-- The rest of release.lua (see its header): after the helpers, for a lock
-- someone waits for, a min_hold, or a lock that is not ours. `owner`,
-- `owner_len`, `held`, `ours` and `events` come from release.lua, which runs
-- first.
if ours then
  local keep_ms = tonumber(ARGV[3]) or 0
  if keep_ms > 0 then
    redis.call('PEXPIRE', KEYS[1], keep_ms)
    return {1, owner}
  end
  -- A hand-off overwrites the lock; with nobody queued, it goes, and waiters
  -- that do not queue hear of it.
  if not queue_hand_off(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[4], events) then
    redis.call('DEL', KEYS[1])
    redis.call('PUBLISH', ARGV[2], owner)
    if events ~= '' then
      redis.call('PUBLISH', events, 'released ' .. (string.match(held, '^%d+', owner_len + 2) or '0'))
    end
  end
  return {1, owner}
end
queue_drop(KEYS[3], KEYS[4], owner)
if not held then
  queue_hand_off(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[4], events)
end
return {0, owner}
