-- Releases a hold of a shared kind if it is still ours, or takes a waiter out of the
-- queue (an acquire that gave up or was cancelled; also releases a grant it did not
-- learn of), then grants the waiters the holders now admit (see shared.lua).
-- KEYS: as in shared.lua (lock, fencing counter, queue, liveness, holders' table);
-- KEYS[6]: the break mark
-- ARGV[1]: owner token; ARGV[2]: the id of a waiter to take out of the queue, or ""
-- ARGV[3]: channel prefix of the clients' wake-up channels; ARGV[4]: the change channel
-- Returns 1 when released, 0 when the hold is gone, -1 when others hold and it is not
-- among them, -2 when a force release removed it.
-- The helpers come from tokens.lua, queue.lua, broken.lua and shared.lua.

local owner = ARGV[1]
if ARGV[2] ~= '' then
  -- Whatever holds the name now (another kind, after a force release), the waiter leaves.
  leave(ARGV[2])
  redis.call('HDEL', TABLE, 'q:' .. ARGV[2])
end
local found = redis.call('TYPE', LOCK)['ok']
if found ~= 'none' and found ~= 'zset' then
  return not_held(KEYS[6], owner)
end
local now = now_ms()
local status
local expiry = redis.call('ZSCORE', LOCK, owner)
if expiry and tonumber(expiry) > now then
  status = 1
end
redis.call('ZREM', LOCK, owner)
redis.call('HDEL', TABLE, owner)
evict(now, TABLE)
purge(now)
if status == nil then
  status = not_held(KEYS[6], owner)
else
  redis.call(PUBLISH, ARGV[4], 'released')
end
settle(ARGV[3], ARGV[4], now)
if redis.call('EXISTS', LOCK) == 0 and redis.call('EXISTS', QUEUE) == 0 then
  -- Nobody holds or waits: the name's kind goes with them.
  redis.call('DEL', TABLE)
end
return status
