-- Fencing tokens: the helpers every acquire script starts with (prepended in Rust).
-- KEYS[2] is the fencing counter of the lock.
--
-- Tokens never go back while the server clock does not, also after partial data loss (a
-- counter restored stale from a snapshot or a lagging replica, or evicted): a token is
-- max(counter + 1, server clock in microseconds), and the counter is set to it.

-- The server clock in microseconds (exact in a Lua number until the year 2255).
local function clock()
  local now = redis.call('TIME')
  return tonumber(now[1]) * 1000000 + tonumber(now[2])
end

-- The next fencing token, stored in the counter: max(counter + 1, clock).
local function next_token()
  local now = clock()
  local current = tonumber(redis.call('GET', KEYS[2]) or '0')
  if current == nil or current >= now then
    -- INCR keeps large counters exact (and fails clearly on one that is not a number).
    return redis.call('INCR', KEYS[2])
  end
  redis.call('SET', KEYS[2], string.format('%.0f', now))
  return now
end

-- RedLock: what this server knows of the tokens, max(counter, clock), unchanged.
local function reading()
  local value = redis.call('GET', KEYS[2])
  local now = clock()
  local current = tonumber(value or '0')
  if current ~= nil and current >= now then
    return value
  end
  return now
end

