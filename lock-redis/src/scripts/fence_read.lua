-- RedLock: reads a lock's fencing counter on one server.
-- KEYS[1]: the fencing counter
-- Returns the counter; a missing counter reads as the server clock in microseconds (see
-- acquire.lua), so tokens keep increasing when a server lost its data.
local value = redis.call('GET', KEYS[1])
if value then
  return value
end
local now = redis.call('TIME')
return now[1] .. string.format('%06d', tonumber(now[2]))
