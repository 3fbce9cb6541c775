-- Takes a lock on one server, atomically with its fencing token (single server) or with a
-- reading of its fencing counter (RedLock).
-- KEYS[1]: the lock key (a plain string holding the owner token)
-- KEYS[2]: the fencing counter of the lock
-- ARGV[1]: owner token; ARGV[2]: TTL in milliseconds
-- ARGV[3]: "1" to take the next fencing token (single server), "0" not to (RedLock)
-- Single server: returns {1, fencing token} when the lock is ours, {0, PTTL of the
-- holder} when it is not.
-- RedLock: returns {1, 0, counter} when the lock is ours, {0, PTTL of the holder, counter}
-- when it is not. The counter is only read, never changed (the client writes back the
-- maximum of a majority + 1 with fence_write.lua); read in the same atomic step as the
-- SET, it reflects every token a previous holder stored here while its key was here. A
-- missing counter reads as the server clock in microseconds, as below.
local function counter()
  local value = redis.call('GET', KEYS[2])
  if value then
    return value
  end
  local now = redis.call('TIME')
  return now[1] .. string.format('%06d', tonumber(now[2]))
end
local holder = redis.call('GET', KEYS[1])
if holder == false then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
elseif holder == ARGV[1] then
  -- An earlier attempt of this same acquisition got through: renew it.
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  if ARGV[3] ~= '1' then
    return {1, 0, counter()}
  end
  return {1, tonumber(redis.call('GET', KEYS[2]) or '0')}
else
  if ARGV[3] ~= '1' then
    return {0, redis.call('PTTL', KEYS[1]), counter()}
  end
  return {0, redis.call('PTTL', KEYS[1])}
end
if ARGV[3] ~= '1' then
  return {1, 0, counter()}
end
if redis.call('EXISTS', KEYS[2]) == 0 then
  -- A missing counter starts at the server clock in microseconds, so tokens keep
  -- increasing even after a restart lost the counter (as long as the clock does not
  -- go back).
  local now = redis.call('TIME')
  redis.call('SET', KEYS[2], now[1] .. string.format('%06d', tonumber(now[2])))
end
return {1, redis.call('INCR', KEYS[2])}
