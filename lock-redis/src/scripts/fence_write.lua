-- RedLock, second round: stores a new fencing token on one server (set if greater), if
-- the lock there is still ours and the counter is below the token. The token is the
-- maximum of the readings, max(counter, server clock in microseconds), that a majority
-- returned with their acquire (acquire.lua) + 1, so it is above this server's counter
-- wherever the lock is ours.
-- KEYS[1]: the lock key; KEYS[2]: the fencing counter
-- ARGV[1]: owner token; ARGV[2]: the new token
-- A candidate of an election also passes KEYS[3]: its leader hash, whose term the token
-- becomes (where the entry is this owner's), and ARGV[3]: the change channel, told of
-- the grant.
-- Returns 1 when stored, 0 otherwise.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local current = redis.call('GET', KEYS[2])
if current and tonumber(current) >= tonumber(ARGV[2]) then
  return 0
end
redis.call('SET', KEYS[2], ARGV[2])
if KEYS[3] and redis.call('HGET', KEYS[3], 'owner') == ARGV[1] then
  redis.call('HSET', KEYS[3], 'term', ARGV[2])
  redis.call(PUBLISH, ARGV[3], 'elected')
end
return 1
