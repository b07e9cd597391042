-- Renew the lease of a read hold or a permit if it is still ours: at least
-- ARGV[2] from now.
--
-- KEYS[1]  holders: sorted set, owner token -> end of its lease (server ms)
-- KEYS[2]  the holders' details (see shared_prelude.lua), whose TTL follows
--          the set's
-- KEYS[3]  (semaphores only) the permit count, whose TTL follows the set's
-- ARGV[1]  owner token
-- ARGV[2]  lease in milliseconds
-- ARGV[3]  "1": the hold ends ARGV[2] ms from now, sooner or later than it
--          did (extend); "0": unless it ends later already (a renewal never
--          shortens a lease: one run late, after an extend to a longer lease,
--          must not end the hold before its holder's deadline)
--
-- Returns {1, owner}  ours: the hold now ends ARGV[2] ms from now (or later,
--                     with ARGV[3] "0")
--         {0, owner}  gone or expired, or the holders' name holds a value of
--                     another type: the holder has lost it
local now = now_ms()
-- Another type answers ZSCORE with an error (a table).
local score = redis.pcall('ZSCORE', KEYS[1], ARGV[1])
if type(score) == 'string' and tonumber(score) > now then
  local ends = now + tonumber(ARGV[2])
  if ARGV[3] ~= '1' and tonumber(score) > ends then
    ends = tonumber(score)
  end
  redis.call('ZADD', KEYS[1], 'XX', string.format('%.0f', ends), ARGV[1])
  push_expiry(KEYS[1], KEYS[2], KEYS[3])
  return {1, ARGV[1]}
end
return {0, ARGV[1]}
