-- Releases a lock if it is still ours, or takes a waiter out of the queue (an acquire
-- that gave up or was cancelled; also releases a grant it did not learn of), and, when
-- the key is then free, hands it to the head of the queue if the head asked for grants
-- (see grant_head in queue.lua), else wakes the head.
-- KEYS: as in queue.lua (lock, fencing counter, queue, liveness); KEYS[5]: the break mark
-- (on Redis Cluster ARGV[7] instead, as in release.lua)
-- ARGV[1]: owner token; ARGV[2]: the id of a waiter to take out of the queue, or ""
-- ARGV[3]: channel prefix of the clients' wake-up channels
-- ARGV[4]: how long (ms) a woken head has to take the lock
-- ARGV[5]: a candidate's leader hash, "" for a mutex; ARGV[6]: the election's change
-- channel (as in release.lua)
-- Returns 1 when released, 0 when the key is gone, -1 when another owner holds it, -2
-- when a force release removed it (the break mark is read only for a key that is not
-- ours).
-- The helpers come from tokens.lua, queue.lua, broken.lua and leader.lua.

local mark = KEYS[5] or ARGV[7]
local holder = redis.call('GET', LOCK)
resign(ARGV[5], ARGV[1], ARGV[6], holder == ARGV[1])
local status = 1
if holder == ARGV[1] then
  redis.call('DEL', LOCK)
else
  status = not_ours(mark, holder, ARGV[1])
end
if ARGV[2] ~= '' then
  leave(ARGV[2])
end
-- While nobody queues, nobody is to be woken: the release is a plain compare-and-delete.
if (status == 1 or holder == false) and redis.call('EXISTS', QUEUE) == 1 then
  local now, now_us = now_ms()
  if not grant_head(ARGV[3], now, now_us) then
    evict(now)
    wake_head(ARGV[3], tonumber(ARGV[4]), now, false)
  end
end
return status
