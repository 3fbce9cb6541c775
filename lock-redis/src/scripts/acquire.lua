-- Takes a lock on one server, atomically with its fencing token.
-- KEYS[1]: the lock key (a plain string holding the owner token)
-- KEYS[2]: the fencing counter of the lock
-- ARGV[1]: owner token; ARGV[2]: TTL in milliseconds
-- ARGV[3]: "1" to take the next fencing token (single server), "0" not to (RedLock)
-- Returns {1, fencing token} when the lock is ours, {0, PTTL of the holder} when it is not.
local holder = redis.call('GET', KEYS[1])
if holder == false then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
elseif holder == ARGV[1] then
  -- An earlier attempt of this same acquisition got through: renew it.
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  if ARGV[3] ~= '1' then
    return {1, 0}
  end
  return {1, tonumber(redis.call('GET', KEYS[2]) or '0')}
else
  return {0, redis.call('PTTL', KEYS[1])}
end
if ARGV[3] ~= '1' then
  return {1, 0}
end
if redis.call('EXISTS', KEYS[2]) == 0 then
  -- A missing counter starts at the server clock in microseconds, so tokens keep
  -- increasing even after a restart lost the counter (as long as the clock does not
  -- go back).
  local now = redis.call('TIME')
  redis.call('SET', KEYS[2], now[1] .. string.format('%06d', tonumber(now[2])))
end
return {1, redis.call('INCR', KEYS[2])}
