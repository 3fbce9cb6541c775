-- Shows who holds and who waits for a lock, changing nothing.
-- KEYS: as in queue.lua (lock, fencing counter, queue, liveness); KEYS[5]: the leader
-- hash of the name as an election
-- Returns {owner token in the lock key or nil, its PTTL, fencing counter or nil, {ids of
-- the waiters still alive, in ticket order}, {owner, term, value, version, since} of the
-- leader hash (each nil where absent)}.
-- The helpers come from queue.lua.

local now = now_ms()
local alive = {}
for _, id in ipairs(redis.call('ZRANGEBYSCORE', LIVE, '(' .. now, '+inf')) do
  alive[id] = true
end
local waiters = {}
for _, id in ipairs(redis.call('ZRANGE', QUEUE, 0, -1)) do
  if alive[id] then
    waiters[#waiters + 1] = id
  end
end
local leader = redis.call('HMGET', KEYS[5], 'owner', 'term', 'value', 'version', 'since')
return {redis.call('GET', LOCK), redis.call('PTTL', LOCK), redis.call('GET', KEYS[2]), waiters,
  leader}
