-- Renews many locks of one client in one call.
-- KEYS: the lock key and the break mark of each hold, in pairs; ARGV: owner token and TTL
-- in milliseconds of each hold, in pairs.
-- Returns one status per hold: 1 renewed, 0 gone, -1 held by another owner, -2 removed
-- by a force release (the break mark is read only for a key that is not ours).
-- The helper comes from broken.lua.
local out = {}
for i = 1, #KEYS / 2 do
  local key, token = KEYS[2 * i - 1], ARGV[2 * i - 1]
  local holder = redis.pcall('GET', key)
  if holder == token then
    redis.call('PEXPIRE', key, ARGV[2 * i])
    out[i] = 1
  elseif was_broken(KEYS[2 * i], token) then
    out[i] = -2
  elseif holder == false then
    out[i] = 0
  else
    out[i] = -1
  end
end
return out
