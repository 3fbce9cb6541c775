-- Fencing tokens: the helpers every acquire script starts with (prepended in Rust).
-- KEYS[2] is the fencing counter of the lock.
--
-- Tokens never go back while the server clock does not, also after partial data loss (a
-- counter restored stale from a snapshot or a lagging replica, or evicted): a token is
-- max(counter + 1, server clock in microseconds), and the counter is set to it.
--
-- A floor (the `floor` argument, a decimal number, "" for none; the dual lock's old
-- token) replaces the clock: the token is max(counter + 1, floor), and the floor itself
-- where no counter exists, so that it stays in the token space of the floor's backend.

-- The server clock in microseconds (exact in a Lua number until the year 2255).
local function clock()
  local now = redis.call('TIME')
  return tonumber(now[1]) * 1000000 + tonumber(now[2])
end

-- Whether decimal `a` is below decimal `b` (both without leading zeros), exact at any size.
local function below(a, b)
  if #a ~= #b then
    return #a < #b
  end
  return a < b
end

-- The next fencing token, stored in the counter: max(counter + 1, clock), or
-- max(counter + 1, floor) with a floor. `now`, the server clock in microseconds, saves
-- reading it again (nil: read here).
local function next_token(floor, now)
  if floor ~= '' then
    local value = redis.call('GET', KEYS[2])
    if value and not (string.match(value, '^%d+$') and below(value, floor)) then
      return redis.call('INCR', KEYS[2])
    end
    redis.call('SET', KEYS[2], floor)
    return floor
  end
  now = now or clock()
  local current = tonumber(redis.call('GET', KEYS[2]) or '0')
  if current == nil or current >= now then
    -- INCR keeps large counters exact (and fails clearly on one that is not a number).
    return redis.call('INCR', KEYS[2])
  end
  redis.call('SET', KEYS[2], string.format('%.0f', now))
  return now
end

-- The fencing token of a holder whose key is already its own (one server decides): the
-- grant it was given (by a release's hand-off, or an earlier request of this attempt whose
-- reply was lost), not a second one. While the key is one owner's, only that owner's
-- grants write the counter, so the counter is that grant's token. A second token would
-- put the dual lock's new side one above its old side (the floor). A counter that is
-- gone, not a number or below the floor (a floor the grant did not have) takes the next
-- token as a grant does.
local function held_token(floor)
  local value = redis.call('GET', KEYS[2])
  if value and string.match(value, '^%d+$') and (floor == '' or not below(value, floor)) then
    return value
  end
  return next_token(floor)
end

-- RedLock: what this server knows of the tokens, unchanged: max(counter, clock), or with a
-- floor the counter alone (0 where there is none; the client takes the floor into account).
local function reading(floor)
  local value = redis.call('GET', KEYS[2])
  if floor ~= '' then
    return value or 0
  end
  local now = clock()
  local current = tonumber(value or '0')
  if current ~= nil and current >= now then
    return value
  end
  return now
end
