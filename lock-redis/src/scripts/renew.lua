-- Renews many locks of one client in one call.
-- KEYS: the lock keys; ARGV: owner token and TTL in milliseconds of each key, in pairs.
-- Returns one status per key: 1 renewed, 0 gone, -1 held by another owner.
local out = {}
for i = 1, #KEYS do
  local holder = redis.pcall('GET', KEYS[i])
  if holder == ARGV[2 * i - 1] then
    redis.call('PEXPIRE', KEYS[i], ARGV[2 * i])
    out[i] = 1
  elseif holder == false then
    out[i] = 0
  else
    out[i] = -1
  end
end
return out
