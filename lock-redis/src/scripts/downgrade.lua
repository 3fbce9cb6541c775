-- Downgrades our write hold to a read hold in its place, with no moment between, and
-- grants the readers queued behind it (writers still wait), in one step.
-- KEYS: as in release_s.lua (lock, fencing counter, queue, liveness, holders' table,
-- break mark)
-- ARGV[1]: owner token; ARGV[2]: channel prefix of the clients' wake-up channels;
-- ARGV[3]: the change channel
-- Returns 1 when done (also when the hold is a reader's already: a retry), 0 when the
-- hold is gone, -1 when others hold and it is not among them, -2 when a force release
-- removed it, -3 when the hold is not a writer's (a permit).
-- The helpers come from tokens.lua, queue.lua, broken.lua and shared.lua.

local owner = ARGV[1]
local found = redis.call('TYPE', LOCK)['ok']
if found ~= 'zset' then
  return not_held(KEYS[6], owner)
end
local now = now_ms()
local expiry = redis.call('ZSCORE', LOCK, owner)
if not expiry or tonumber(expiry) <= now then
  return not_held(KEYS[6], owner)
end
local entry = redis.call('HGET', TABLE, owner) or ''
local kind, token = string.match(entry, '^([^:]*):(%d+)$')
if kind == 'R' then
  return 1
elseif kind ~= 'W' then
  return -3
end
redis.call('HSET', TABLE, owner, 'R:' .. token)
evict(now, TABLE)
purge(now)
redis.call(PUBLISH, ARGV[3], 'downgraded')
settle(ARGV[2], ARGV[3], now)
return 1
