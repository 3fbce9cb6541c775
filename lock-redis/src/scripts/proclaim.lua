-- Proclaims a leader's new value: stores it in the leader hash if the lock is still the
-- candidate's and the value is newer than the one stored, and tells the observers.
-- KEYS[1]: the lock key; KEYS[2]: its break mark (on Redis Cluster ARGV[7] instead, as in
-- release.lua)
-- ARGV[1]: owner token; ARGV[2]: the leader hash; ARGV[3]: the value; ARGV[4]: its
-- version (each proclaim of a hold a greater one, so that a late retry never replaces a
-- newer value); ARGV[5]: the election's change channel; ARGV[6]: the hold's term ('' if
-- unknown)
-- Returns 1 when the lock is ours (the value stored, or a newer one already), 0 when the
-- key is gone, -1 when another owner holds it, -2 when a force release removed it.
-- The helpers come from broken.lua and leader.lua.
local mark = KEYS[2] or ARGV[7]
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  local leader = ARGV[2]
  if redis.call('HGET', leader, 'owner') ~= ARGV[1] then
    -- The entry went missing (evicted): it comes back with the term and the value.
    redis.call('DEL', leader)
    redis.call('HSET', leader, 'owner', ARGV[1], 'version', 0)
    if ARGV[6] ~= '' then
      redis.call('HSET', leader, 'term', ARGV[6])
    end
    redis.call('PEXPIRE', leader, math.max(redis.call('PTTL', KEYS[1]), 1))
  end
  local version = tonumber(redis.call('HGET', leader, 'version') or '0') or 0
  if version < tonumber(ARGV[4]) then
    redis.call('HSET', leader, 'value', ARGV[3], 'version', ARGV[4])
    redis.call(PUBLISH, ARGV[5], 'proclaimed')
  end
  return 1
end
return not_ours(mark, holder, ARGV[1])
