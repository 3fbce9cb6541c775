-- RedLock, second round: stores a new fencing token on one server (set if greater), if
-- the lock there is still ours and the counter is below the token. The token is the
-- maximum of the readings, max(counter, server clock in microseconds), that a majority
-- returned with their acquire (acquire.lua) + 1, so it is above this server's counter
-- wherever the lock is ours.
-- KEYS[1]: the lock key; KEYS[2]: the fencing counter
-- ARGV[1]: owner token; ARGV[2]: the new token
-- Returns 1 when stored, 0 otherwise.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local current = redis.call('GET', KEYS[2])
if current and tonumber(current) >= tonumber(ARGV[2]) then
  return 0
end
redis.call('SET', KEYS[2], ARGV[2])
return 1
