-- Resizes a semaphore: every hold and waiter of the name gets the new number of permits
-- (see resized in shared.lua), all or none, then the waiters that now fit are granted.
-- KEYS: as in shared.lua (lock, fencing counter, queue, liveness, holders' table)
-- ARGV[1]: the number of permits it has; ARGV[2]: the number it is to have
-- ARGV[3]: the owner token of the resizer's reservation ("" for none): its hold becomes
-- one of all the new permits; ARGV[4]: channel prefix of the clients' wake-up channels;
-- ARGV[5]: the name's change channel
-- Returns {1} when done (or nobody holds or waits: nothing to write); {-1, what the name
-- is} when it is another kind (as acquire_s.lua says it) or a semaphore of another
-- number; {-2, count} when a hold or waiter takes more than the new number.
-- The helpers come from tokens.lua, queue.lua, broken.lua and shared.lua.

local from, to, reserved = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
local now = now_ms()
local theirs, other = name_kind(now)
if other then
  return other
elseif not theirs then
  return {1}
end
if family(theirs) == 'RW' then
  return {-1, 0}
end
-- Every rewrite decided before any is made.
local function refused(kind)
  local permits, count = permit_of(kind)
  if permits ~= from and permits ~= to then
    return {-1, permits or 0}
  end
  return {-2, count}
end
local writes = {}
for _, owner in ipairs(redis.call('ZRANGE', LOCK, 0, -1)) do
  local entry = redis.call('HGET', TABLE, owner) or ''
  local kind, token = string.match(entry, '^([^:]*):(%d+)$')
  local new = kind and resized(kind, from, to, owner == reserved)
  if not new then
    return refused(kind or 'W')
  end
  writes[#writes + 1] = {owner, new .. ':' .. token}
end
for _, id in ipairs(redis.call('ZRANGE', QUEUE, 0, -1)) do
  local field = 'q:' .. id
  local entry = redis.call('HGET', TABLE, field)
  if entry then
    local kind, rest = string.match(entry, '^([^:]*)(:.*)$')
    local new = kind and resized(kind, from, to, false)
    if not new then
      return refused(kind or 'W')
    end
    writes[#writes + 1] = {field, new .. rest}
  end
end
for _, write in ipairs(writes) do
  redis.call('HSET', TABLE, write[1], write[2])
end
local marked = string.sub(theirs, -1) == 'x'
redis.call('HSET', TABLE, 'kind', 'P' .. to .. (marked and 'x' or ''))
redis.call(PUBLISH, ARGV[5], 'resized')
settle(ARGV[4], ARGV[5], now)
return {1}
