-- Release a fair lock if it is ours and hand it to the first live waiter in
-- the queue; withdraw our queue entry if we left one (a waiter that gave up).
--
-- KEYS[1]  lock (see fair_acquire.lua)
-- KEYS[2]  fencing counter
-- KEYS[3]  queue
-- KEYS[4]  queue entries
-- ARGV[1]  owner token
-- ARGV[2]  wake-up channel (a hand-off publishes on "<channel>:<route of the
--          new holder>", see fair_prelude.lua)
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
local now = fair_clock()
local owner_len = string.len(ARGV[1])
local held = redis.call('GET', KEYS[1])
-- Normally a no-op (a holder's entry went when it got the lock): a waiter
-- that gave up withdraws its entry here.
fair_drop(KEYS[3], KEYS[4], ARGV[1])
if held and string.sub(held, 1, owner_len) == ARGV[1] then
  local keep_ms = tonumber(ARGV[3]) or 0
  if keep_ms > 0 then
    redis.call('PEXPIRE', KEYS[1], keep_ms)
    return {1, ARGV[1]}
  end
  -- A hand-off overwrites the lock; with nobody queued, it goes.
  if not fair_hand_off(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[2], now) then
    redis.call('DEL', KEYS[1])
  end
  return {1, ARGV[1]}
end
if not held then
  fair_hand_off(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[2], now)
end
return {0, ARGV[1]}
