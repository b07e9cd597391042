-- Renew the lease of a lock if it is still ours: at least ARGV[2] from now.
--
-- KEYS[1]  lock: "<owner><mark><token>:<since>:<holder>" (see acquire.lua)
-- ARGV[1]  owner token
-- ARGV[2]  lease in milliseconds
-- ARGV[3]  "1": the TTL becomes ARGV[2], shorter or longer (extend);
--          "0": the TTL becomes ARGV[2] unless it is longer already (a
--          renewal never shortens a lease: one run late, after an extend to
--          a longer lease, must not end the lock before its holder's deadline)
--
-- Returns {1, owner}  the lock is ours: its TTL is ARGV[2] again (or longer,
--                     with ARGV[3] "0")
--         {0, owner}  the lock is gone or held by another owner, or its name
--                     holds a value of another type: nothing changed, and
--                     the holder has lost it.
--
-- `owner` echoes ARGV[1], so the client can tell that a reply is the one to its
-- own request.
-- Another type answers GET with an error (a table): not ours any more, and
-- the holder is told now rather than at its deadline.
local held = redis.pcall('GET', KEYS[1])
if type(held) == 'string' and string.sub(held, 1, string.len(ARGV[1])) == ARGV[1] then
  if ARGV[3] == '1' or redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
  end
  return {1, ARGV[1]}
end
return {0, ARGV[1]}
