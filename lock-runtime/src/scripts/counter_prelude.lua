-- Shared by the counting semaphore's scripts (prepended to each by the
-- client; Redis scripts cannot include one another).
--
-- A counting semaphore is a counter, not a set of holders: its available
-- permits are a decimal string that any caller may raise or lower (negative
-- after a shrink below what is taken), with no lease. Counts are compared
-- and changed as exact 64-bit integers: Lua's numbers are doubles, so the
-- counter is read and returned as its string, compared as a string
-- (at_least) and changed by INCRBY/DECRBY on the server.
--
-- now_ms(): the server clock in milliseconds (waiters' registrations end on
-- it, whatever each client's clock says).
--
-- read_counter(name): the counter's string; false when it does not exist;
-- nil when the name holds another type or a string that is not a canonical
-- decimal integer (a value distlock did not write: left alone). Any other
-- error (an ACL refusal) is raised as the script's error.
--
-- receipt(name): the count a change made under this call's owner token
-- answered, when the same script already ran (sent again after its reply was
-- lost with its connection: a cluster client and the Sentinel backend send a
-- call again on a new connection); false when it did not; nil when the name
-- holds another type. A change that took effect writes its receipt
-- (keep_receipt(name, count, ms): `SET name count PX ms`, nothing for ms
-- '0'), so that running again answers the same and changes nothing: permits
-- are taken or added once per call.
--
-- is_positive(count): whether a canonical decimal string is above zero.
--
-- at_least(count, wanted): whether canonical decimal `count` is at least
-- `wanted`, a positive canonical decimal; exact for every 64-bit value.
--
-- live_waiters(set, now): how many registrations of `set` end after `now`;
-- nil when `set` holds another type.
--
-- wake(channel, set, count, now, owner): publishes a wake-up ("*<owner>": the
-- subscriber wakes every waiter of the channel, see waiting.rs) when `count`
-- is above zero and someone waits; the live waiters' number either way.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- An error reply other than a wrong type (an ACL refusal, say) is raised as
-- it is, not taken for a foreign value.
local function wrong_type(reply)
  if type(reply) ~= 'table' then
    return false
  end
  if not string.find(tostring(reply.err), 'WRONGTYPE', 1, true) then
    error(reply)
  end
  return true
end

local function read_counter(name)
  local value = redis.pcall('GET', name)
  if wrong_type(value) then
    return nil
  end
  if value and value ~= '0' and not string.find(value, '^%-?[1-9]%d*$') then
    return nil
  end
  return value
end

local function receipt(name)
  local value = redis.pcall('GET', name)
  if wrong_type(value) then
    return nil
  end
  return value
end

local function keep_receipt(name, count, ms)
  if ms ~= '0' then
    redis.call('SET', name, count, 'PX', ms)
  end
end

local function is_positive(count)
  return count ~= '0' and string.sub(count, 1, 1) ~= '-'
end

local function at_least(count, wanted)
  if not is_positive(count) then
    return false
  end
  if #count ~= #wanted then
    return #count > #wanted
  end
  return count >= wanted
end

local function live_waiters(set, now)
  local live = redis.pcall('ZCOUNT', set, '(' .. string.format('%.0f', now), '+inf')
  if wrong_type(live) then
    return nil
  end
  return live
end

local function wake(channel, set, count, now, owner)
  local live = live_waiters(set, now) or 0
  if live > 0 and is_positive(count) then
    redis.call('PUBLISH', channel, '*' .. owner)
  end
  return live
end
