-- Breaks a lock (an operator's force release): removes its hold whoever holds it, keeps
-- the owner token removed in the break mark, and wakes the waiters as a release does:
-- the head of the queue, and the listeners of the name's channel (clients without the
-- queue). A free key changes nothing.
-- KEYS: as in queue.lua (lock, fencing counter, queue, liveness); KEYS[5]: the break mark;
-- KEYS[6]: the leader hash of the name as an election; KEYS[7]: the holders' table of
-- the name as a shared kind (see shared.lua: the oldest grant is broken, and the waiters
-- the others then admit are granted)
-- ARGV[1]: how long (ms) the mark stays at least (it stays three times the removed hold's
-- remaining lease when that is longer); ARGV[2]: how many owner tokens it keeps
-- ARGV[3]: channel prefix of the clients' wake-up channels
-- ARGV[4]: how long (ms) a woken head has to take the lock
-- ARGV[5]: the wake-up channel of the name (without the queue)
-- ARGV[6]: the change channel of the name as an election
-- ARGV[7]: the only owner token to remove ('': whoever holds the key; RedLock names the
-- holder the servers showed, so that a break arriving late at one server spares the
-- successor that took it first)
-- Returns {owner token removed, its PTTL (-1: no expiry), its term, its value} (the last
-- two nil unless a candidate held it), or {nil, -2} when the key was free (or held by
-- another than ARGV[7]); for a shared kind's holder also "<kind>:<fencing token>" of the
-- hold removed.
-- The helpers come from tokens.lua, queue.lua, leader.lua, broken.lua and shared.lua.

if redis.call('TYPE', LOCK)['ok'] == 'zset' then
  -- A shared kind's holders (see shared.lua): the oldest grant is broken.
  TABLE = KEYS[7]
  local now = now_ms()
  purge(now)
  local oldest, first, first_pttl, first_entry = nil, nil, -2, false
  local live = redis.call('ZRANGEBYSCORE', LOCK, '(' .. now, '+inf', 'WITHSCORES')
  for i = 1, #live, 2 do
    local entry = redis.call('HGET', KEYS[7], live[i]) or ''
    local token = tonumber(string.match(entry, ':(%d+)$') or '0')
    if oldest == nil or token < oldest then
      oldest, first, first_pttl, first_entry = token, live[i], tonumber(live[i + 1]) - now, entry
    end
  end
  if first == nil then
    return {false, -2, false, false, false}
  end
  redis.call('ZREM', LOCK, first)
  redis.call('HDEL', KEYS[7], first)
  local mark = KEYS[5]
  redis.call('RPUSH', mark, first)
  redis.call('LTRIM', mark, -tonumber(ARGV[2]), -1)
  redis.call('PEXPIRE', mark, math.max(tonumber(ARGV[1]), 3 * first_pttl))
  evict(now, TABLE)
  settle(ARGV[3], ARGV[6], now)
  redis.call(PUBLISH, ARGV[6], 'broken')
  return {first, first_pttl, false, false, first_entry}
end
local holder = redis.call('GET', LOCK)
if holder == false or (ARGV[7] ~= '' and holder ~= ARGV[7]) then
  return {false, -2, false, false, false}
end
local pttl = redis.call('PTTL', LOCK)
local term, value = false, false
if redis.call('HGET', KEYS[6], 'owner') == holder then
  term = redis.call('HGET', KEYS[6], 'term')
  value = redis.call('HGET', KEYS[6], 'value')
end
resign(KEYS[6], holder, ARGV[6], true)
redis.call('DEL', LOCK)
local mark = KEYS[5]
redis.call('RPUSH', mark, holder)
redis.call('LTRIM', mark, -tonumber(ARGV[2]), -1)
redis.call('PEXPIRE', mark, math.max(tonumber(ARGV[1]), 3 * pttl))
if redis.call('EXISTS', QUEUE) == 1 then
  local now = now_ms()
  evict(now)
  wake_head(ARGV[3], tonumber(ARGV[4]), now, false)
end
redis.call(PUBLISH, ARGV[5], 'released')
return {holder, pttl, term, value, false}
