-- The uncontended path of acquire_q.lua, run before the queue's and the elections'
-- helpers are defined (defining them costs the server more than this path itself): a
-- free key while nobody queues goes at once to a mutex on one server (a fencing token
-- taken here; not a candidate, whose grant stores its entry, nor RedLock's reading).
-- KEYS and ARGV as in acquire_q.lua; next_token comes from tokens.lua.
if KEYS[5] == nil and ARGV[3] == '1' and redis.call('EXISTS', KEYS[3]) == 0
    and redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {1, next_token(ARGV[7]), 0}
end
