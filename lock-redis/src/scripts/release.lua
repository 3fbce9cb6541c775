-- Releases a lock if it is still ours and wakes the waiters listening to its channel.
-- KEYS[1]: the lock key; KEYS[2]: its break mark
-- ARGV[1]: owner token; ARGV[2]: the wake-up channel, or "" for no wake-up (the RedLock
-- servers beside the one whose queue orders the waiters, and on Redis Cluster the
-- fallback of the queue's release while its slot migrates)
-- ARGV[3]: a candidate's leader hash, "" for a mutex; ARGV[4]: the election's change
-- channel (see leader.lua): the candidate's entry goes with its hold (an entry left by a
-- hold already lost goes too), and observers are told
-- On Redis Cluster the break mark comes as ARGV[5] instead and KEYS holds the lock key
-- alone: a script whose declared keys are not all on a migrating slot's node is refused
-- (TRYAGAIN) until the move ends, and the mark is hardly ever there.
-- Returns 1 when released, 0 when the key is gone, -1 when another owner holds it, -2
-- when a force release removed it (the break mark is read only for a key that is not
-- ours).
-- The helpers come from broken.lua and leader.lua.
local mark = KEYS[2] or ARGV[5]
local holder = redis.call('GET', KEYS[1])
resign(ARGV[3], ARGV[1], ARGV[4], holder == ARGV[1])
if holder == ARGV[1] then
  redis.call('DEL', KEYS[1])
  if ARGV[2] ~= '' then
    redis.call(PUBLISH, ARGV[2], 'released')
  end
  return 1
end
return not_ours(mark, holder, ARGV[1])
