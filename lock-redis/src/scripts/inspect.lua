-- Shows who holds and who waits for a lock, changing nothing.
-- KEYS: as in queue.lua (lock, fencing counter, queue, liveness); KEYS[5]: the leader
-- hash of the name as an election; KEYS[6]: the holders' table of the name as a shared
-- kind (see shared.lua)
-- Returns {owner token in the lock key or nil, its PTTL, fencing counter or nil, {ids of
-- the waiters still alive, in ticket order}, {owner, term, value, version, since} of the
-- leader hash (each nil where absent), {owner, "<kind>:<fencing token>", ms left} of each
-- live holder of a shared kind, oldest grant first, flattened, {the kind of each waiter
-- listed, "" where unknown}}.
-- The helpers come from queue.lua.

local now = now_ms()
local alive = {}
for _, id in ipairs(redis.call('ZRANGEBYSCORE', LIVE, '(' .. now, '+inf')) do
  alive[id] = true
end
local waiters, kinds = {}, {}
for _, id in ipairs(redis.call('ZRANGE', QUEUE, 0, -1)) do
  if alive[id] then
    waiters[#waiters + 1] = id
    local entry = redis.call('HGET', KEYS[6], 'q:' .. id) or ''
    kinds[#kinds + 1] = string.match(entry, '^([^:]*)') or ''
  end
end
local leader = redis.call('HMGET', KEYS[5], 'owner', 'term', 'value', 'version', 'since')
local holder, pttl, shared = false, -2, {}
if redis.call('TYPE', LOCK)['ok'] == 'zset' then
  local holders = {}
  local live = redis.call('ZRANGEBYSCORE', LOCK, '(' .. now, '+inf', 'WITHSCORES')
  for i = 1, #live, 2 do
    local entry = redis.call('HGET', KEYS[6], live[i]) or ''
    local token = tonumber(string.match(entry, ':(%d+)$') or '0')
    holders[#holders + 1] = {token, live[i], entry, tonumber(live[i + 1]) - now}
  end
  table.sort(holders, function(a, b) return a[1] < b[1] end)
  for _, h in ipairs(holders) do
    shared[#shared + 1] = h[2]
    shared[#shared + 1] = h[3]
    shared[#shared + 1] = string.format('%.0f', h[4])
  end
  pttl = redis.call('PTTL', LOCK)
else
  holder, pttl = redis.call('GET', LOCK), redis.call('PTTL', LOCK)
end
return {holder, pttl, redis.call('GET', KEYS[2]), waiters, leader, shared, kinds}
