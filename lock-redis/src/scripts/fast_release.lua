-- The uncontended path of release_q.lua, run before its helpers are defined (defining
-- them costs the server more than this path itself): a mutex's own key (no candidate's
-- entry to remove, no waiter to take out) while nobody queues is deleted at once.
-- KEYS and ARGV as in release_q.lua.
if ARGV[5] == '' and ARGV[2] == '' and redis.call('EXISTS', KEYS[3]) == 0
    and redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
