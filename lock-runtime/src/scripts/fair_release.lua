-- Release a fair lock if it is ours and hand it to the first live waiter in
-- the queue; withdraw our queue entry if we left one (a waiter that gave up).
--
-- KEYS[1]  lock (see fair_acquire.lua)
-- KEYS[2]  fencing counter
-- KEYS[3]  queue
-- KEYS[4]  queue entries
-- ARGV[1]  owner token
-- ARGV[2]  wake-up channel
-- ARGV[3]  keep_ms: above 0, the rest of a min_hold: the lock is kept that
--          long instead of handed off (the head takes it when it has expired,
--          at its next attempt or any other caller's)
--
-- Returns {1, owner}  the lock was ours and is handed off, deleted (nobody
--                     waits) or kept
--         {0, owner}  it was not ours (our lease ran out, or we never held
--                     it: the release only withdrew our queue entry)
--
-- A hand-off publishes "=<new owner>:<its fencing token>" (see
-- fair_prelude.lua). A withdrawal that finds the lock free hands it off too,
-- so a cancelled head does not hold up the next waiter.
local now = now_ms()
local owner_len = string.len(ARGV[1])
local held = redis.call('GET', KEYS[1])
fair_drop(KEYS[3], KEYS[4], ARGV[1])
if held and string.sub(held, 1, owner_len) == ARGV[1] then
  local keep_ms = tonumber(ARGV[3]) or 0
  if keep_ms > 0 then
    redis.call('PEXPIRE', KEYS[1], keep_ms)
    fair_tidy(KEYS[3], KEYS[4])
    return {1, ARGV[1]}
  end
  redis.call('DEL', KEYS[1])
  fair_hand_off(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[2], now)
  return {1, ARGV[1]}
end
if not held then
  fair_hand_off(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[2], now)
else
  fair_tidy(KEYS[3], KEYS[4])
end
return {0, ARGV[1]}
