-- Takes a lock on one server, atomically with its fencing token (single server) or with a
-- reading of its fencing counter (RedLock).
-- KEYS[1]: the lock key (a plain string holding the owner token)
-- KEYS[2]: the fencing counter of the lock
-- ARGV[1]: owner token; ARGV[2]: TTL in milliseconds
-- ARGV[3]: "1" to take the next fencing token (single server), "0" not to (RedLock)
-- ARGV[4]: the floor of the fencing token, "" for none (see tokens.lua)
-- A candidate of an election also passes KEYS[3]: its leader hash; ARGV[5]: its value;
-- ARGV[6]: the election's change channel (see leader.lua).
-- Single server: returns {1, fencing token} when the lock is ours, {0, PTTL of the
-- holder} when it is not. Both: {-1, what the name is (its permits, 0 for a read-write
-- lock)} when a semaphore or a read-write lock holds it.
-- RedLock: returns {1, 0, reading} when the lock is ours, {0, PTTL of the holder, reading}
-- when it is not. The reading is max(counter, server clock in microseconds), with a floor
-- the counter alone, and changes nothing (the client writes back the maximum of a
-- majority + 1, or the floor if higher, with fence_write.lua);
-- taken in the same atomic step as the SET, it covers every token a previous holder
-- stored here while its key was here.
-- The token helpers (clock, next_token, held_token, reading) come from tokens.lua,
-- shared_kind from kinds.lua, elect from leader.lua.

local holder = redis.pcall('GET', KEYS[1])
if type(holder) == 'table' and holder.err then
  -- Not a plain key: a semaphore or a read-write lock holds the name.
  local theirs = shared_kind()
  if theirs == nil then
    return redis.error_reply(holder.err)
  end
  return {-1, theirs}
end
local mine = holder == ARGV[1]
if holder == false then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
elseif mine then
  -- An earlier request of this same attempt got through (its reply was lost): renew it;
  -- on one server it keeps the token that request took (held_token). RedLock's reading
  -- comes before its write-back, and each RedLock round has an owner token of its own.
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
elseif ARGV[3] == '1' then
  return {0, redis.call('PTTL', KEYS[1])}
else
  return {0, redis.call('PTTL', KEYS[1]), reading(ARGV[4])}
end
if ARGV[3] == '1' then
  local token
  if mine then
    token = held_token(ARGV[4])
  else
    token = next_token(ARGV[4])
  end
  elect(KEYS[3], ARGV[1], ARGV[5], token, ARGV[2], ARGV[6])
  return {1, token}
end
elect(KEYS[3], ARGV[1], ARGV[5], nil, ARGV[2], ARGV[6])
return {1, 0, reading(ARGV[4])}
