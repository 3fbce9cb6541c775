-- Changes the kind of our read-write hold in its place, with no moment between in which
-- it holds neither: a downgrade (a writer becomes a reader, and the readers queued behind
-- it are granted in the same step; writers still wait) or an upgrade step (an
-- upgradeable reader becomes a writer: nobody queued is granted beside it from then on;
-- it holds alone once the readers granted beside it have left).
-- KEYS: as in release_s.lua (lock, fencing counter, queue, liveness, holders' table,
-- break mark)
-- ARGV[1]: owner token; ARGV[2]: channel prefix of the clients' wake-up channels;
-- ARGV[3]: the change channel; ARGV[4]: "R" to downgrade, "W" to upgrade
-- Returns 1 when done (also when the hold has that kind already: a retry), 2 for an
-- upgrade whose readers still hold, 0 when the hold is gone, -1 when others hold and it
-- is not among them, -2 when a force release removed it, -3 when the hold is of another
-- kind (a permit; a reader for an upgrade).
-- The helpers come from tokens.lua, queue.lua, broken.lua and shared.lua.

local owner, target = ARGV[1], ARGV[4]
local from = target == 'W' and 'U' or 'W'
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
if kind ~= target and kind ~= from then
  return -3
end
evict(now, TABLE)
purge(now)
if kind == from then
  redis.call('HSET', TABLE, owner, target .. ':' .. token)
  redis.call(PUBLISH, ARGV[3], target == 'W' and 'upgraded' or 'downgraded')
  settle(ARGV[2], ARGV[3], now)
end
if target == 'W' and redis.call('ZCARD', LOCK) > 1 then
  return 2
end
return 1
