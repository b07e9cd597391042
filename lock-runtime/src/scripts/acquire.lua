-- One attempt to take the default lock: an attempt that asks for its fencing
-- token at once (eager fencing), or any attempt of a waiting acquisition, which
-- queues up in the same script when the lock is busy. (An attempt without a
-- token that does not wait is no script at all: a plain `SET NX PX GET`.)
--
-- KEYS[1]  lock: a string "<owner><mark><token>:<since>:<holder>" whose TTL is
--          the lease. <owner> is the owner token (32 hex digits), <mark> '+'
--          while anyone waits (the release then reads the queue) and '-'
--          before, <token> the fencing token (0 until one is issued, see
--          issue_token.lua), <since> the acquisition time (milliseconds since
--          the Unix epoch) and <holder> the holder's description (free text).
-- KEYS[2]  fencing counter: the last token issued for this lock
-- KEYS[3]  queue: sorted set, owner token -> arrival time (queue_prelude.lua)
-- KEYS[4]  queue entries: hash, owner token ->
--          "<expiry>:<ttl>:<fence_ttl>:<route>:<attempt>:<holder>"
-- ARGV[1]  owner token
-- ARGV[2]  lease in milliseconds
-- ARGV[3]  TTL of the fencing counter in milliseconds (lease + retention) when
--          the caller wants its token now; '0' when it does not (token 0)
-- ARGV[4]  '+' when the caller waits for this lock, '-' when it does not (a
--          first try, or try_acquire)
-- ARGV[5]  <since>
-- ARGV[6]  <holder>
-- ARGV[7]  '1' when a waiting caller queues up; '0' when it only marks the
--          lock and waits for the release's broadcast (a Redlock member, whose
--          waiters cannot queue on each member independently)
-- ARGV[8]  queue lease ms: a queued caller's entry lasts that long unless its
--          next attempt refreshes it
-- ARGV[9]  hand-off TTL ms: the TTL the lock gets when it is handed to the
--          caller; at most the queue lease (a holder that renews brings the
--          TTL up to its lease with its first renewal, due a third of it after
--          the hand-off; one that does not, with one more attempt)
-- ARGV[10] hand-off base ("<prefix>handoff"), for the hand-offs this script
--          makes (each on "<base>:<route of the new holder>"), and for the
--          notice "!<holder's owner token>" the first queued waiter of a hold
--          sends on "<base>:<the token's last 8 digits>" (its manager's route)
-- ARGV[11] route: the hand-off tag of the caller's manager (hex), kept in its
--          queue entry
-- ARGV[12] the number of this attempt of the caller's, kept in its queue entry
--          and echoed by a hand-off (see queue_prelude.lua)
-- ARGV[13] events channel ("<prefix>events:<key>"), or '' for a manager
--          without lock events: a grant publishes
--          "acquired <token> <since> <holder>" on it, a hand-off
--          "handed-over <token> <since> <holder>" (queue_prelude.lua)
--
-- Returns {1, token, owner}  ours with fencing token `token` (0: none yet):
--                            freshly taken, or already ours (handed off to us
--                            by a release, or a retry whose reply was lost);
--                            the TTL is reset to the lease and our queue entry
--                            is gone
--         {0, pttl, owner}   busy: another owner holds it for `pttl` more ms
--                            (-1 for a key with no TTL); a queued caller waits
--                            for its hand-off, and attempts again when that
--                            lease runs out without one
--         {3, 0, owner}      the lock's name holds a value distlock did not
--                            write (another type, or a string of another
--                            shape): nothing was changed
-- `owner` echoes ARGV[1], so the client can tell that a reply is the one to its
-- own request.
--
-- The lock is free for the caller only when nobody live is queued before it.
-- A free lock with a live head that is not the caller (its holder's lease ran
-- out, nobody released it) is handed to that head here, at once, rather than
-- when the head's next attempt comes.
local owner = ARGV[1]
local owner_len = string.len(owner)
local queued = ARGV[4] == '+' and ARGV[7] == '1'
local events = ARGV[13] or ''
local held = redis.pcall('GET', KEYS[1])
if type(held) == 'table' then
  return {3, 0, owner}
end
if held then
  if string.sub(held, 1, owner_len) == owner then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    queue_drop(KEYS[3], KEYS[4], owner)
    return {1, tonumber(string.match(held, '^%d+', owner_len + 2)) or 0, owner}
  end
  if not is_lock_value(held) then
    return {3, 0, owner}
  end
else
  local head, _, _, _, _, _, _, head_mark = queue_head(KEYS[3], KEYS[4])
  if head == nil or head == owner then
    if head then
      queue_drop(KEYS[3], KEYS[4], owner)
    end
    local token = next_token(KEYS[2], ARGV[3])
    -- Marked while others may wait: queued waiters (behind us, when we were
    -- the head), or (a waiter that does not queue) the others it waited
    -- beside, who hear of the release only if the lock is marked.
    local mark = head_mark or '-'
    if ARGV[4] == '+' and not queued then
      mark = '+'
    end
    local text = string.format('%.0f', token)
    redis.call('SET', KEYS[1], owner .. mark .. text .. ':' .. ARGV[5] .. ':' .. ARGV[6], 'PX', ARGV[2])
    if events ~= '' then
      redis.call('PUBLISH', events, 'acquired ' .. text .. ' ' .. ARGV[5] .. ' ' .. ARGV[6])
    end
    return {1, token, owner}
  end
  queue_hand_off(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[10], events)
  held = redis.call('GET', KEYS[1])
end
if ARGV[4] == '+' then
  if queued then
    queue_enqueue(KEYS[3], KEYS[4], owner, ARGV[8], ARGV[9], ARGV[3], ARGV[11], ARGV[12], ARGV[6])
  end
  if mark_waited_for(KEYS[1], held) and queued then
    -- The first waiter of a hold tells the holder's manager, on its hand-off
    -- channel (the route that ends the holder's owner token, see
    -- config::owner_token_routed), so that the holder's release hands the
    -- lock over at once instead of first trying release_free.lua. Every
    -- manager listens there from its first acquisition of a default lock on
    -- (subscribed in the background); a notice it does not hear (sent
    -- before that subscription is live) leaves its release the two steps.
    -- One message per contended hold; none for a free one.
    redis.call('PUBLISH', ARGV[10] .. ':' .. string.sub(held, 25, 32), '!' .. string.sub(held, 1, 32))
  end
end
return {0, redis.call('PTTL', KEYS[1]), owner}
