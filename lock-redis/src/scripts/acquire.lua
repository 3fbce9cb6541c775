-- Takes a lock on one server, atomically with its fencing token (single server) or with a
-- reading of its fencing counter (RedLock).
-- KEYS[1]: the lock key (a plain string holding the owner token)
-- KEYS[2]: the fencing counter of the lock
-- ARGV[1]: owner token; ARGV[2]: TTL in milliseconds
-- ARGV[3]: "1" to take the next fencing token (single server), "0" not to (RedLock)
-- Single server: returns {1, fencing token} when the lock is ours, {0, PTTL of the
-- holder} when it is not.
-- RedLock: returns {1, 0, reading} when the lock is ours, {0, PTTL of the holder, reading}
-- when it is not. The reading is max(counter, server clock in microseconds) and changes
-- nothing (the client writes back the maximum of a majority + 1 with fence_write.lua);
-- taken in the same atomic step as the SET, it covers every token a previous holder
-- stored here while its key was here.
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

local holder = redis.call('GET', KEYS[1])
if holder == false then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
elseif holder == ARGV[1] then
  -- An earlier request of this same attempt got through (its reply was lost): renew it;
  -- it takes a token like any grant.
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
elseif ARGV[3] == '1' then
  return {0, redis.call('PTTL', KEYS[1])}
else
  return {0, redis.call('PTTL', KEYS[1]), reading()}
end
if ARGV[3] == '1' then
  return {1, next_token()}
end
return {1, 0, reading()}
