-- A fenced store's write (lock_core::fence): stores a value only if its fencing token is at
-- least the newest the resource has accepted, in one step of the server.
-- KEYS[1]: the resource's hash (fields `token` and `value`)
-- ARGV[1]: the token (decimal, no leading zeros); ARGV[2]: the value
-- Returns {1, token} when stored, {0, newest} otherwise (tokens as decimal text).
-- Tokens compare as text of decimal digits (longer is larger, then by digit), exact over
-- all of u64 where Lua's numbers (doubles) are not.
local newest = redis.call('HGET', KEYS[1], 'token')
if newest and (#newest > #ARGV[1] or (#newest == #ARGV[1] and newest > ARGV[1])) then
  return {0, newest}
end
redis.call('HSET', KEYS[1], 'token', ARGV[1], 'value', ARGV[2])
return {1, ARGV[1]}
