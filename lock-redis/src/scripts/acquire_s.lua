-- Takes a hold of a shared kind (a permit, a reader, a writer) in arrival order, on the
-- queue of the mutex (see shared.lua for the layout and the grant rule).
-- KEYS: as in shared.lua (lock, fencing counter, queue, liveness, holders' table)
-- ARGV[1]: owner token; ARGV[2]: TTL in milliseconds
-- ARGV[3]: waiter id; ARGV[4]: how long (ms) the waiter stays queued without showing up
-- ARGV[5]: "1" to queue when refused, "0" not to (a try)
-- ARGV[6]: the floor of the fencing token, "" for none (see tokens.lua)
-- ARGV[7]: channel prefix of the clients' wake-up channels
-- ARGV[8]: the hold's kind ("R", "W", "U", "P<permits>", "P<permits>x<count>");
-- ARGV[9]: the name's change channel
-- ARGV[10]: for a waiter that takes grants (see shared.lua) its round, else "" or nothing;
-- ARGV[11]: then the grant's lease in milliseconds
-- Returns {1, fencing token, 0} when the hold is ours (granted now, or by an earlier call
-- that settled the queue: its expiry then counts from now); {0, ms until the first hold
-- expires (-2: nobody holds), 0, place in the queue (0 = head; -1 not queued)} when not;
-- {-1, what the name is} when it is another kind: its permits, 0 for a read-write lock,
-- -1 for a mutex or an election (a plain string key, or mutex waiters queued).
-- The helpers come from tokens.lua, queue.lua, broken.lua and shared.lua.

local owner, ttl, me, kind = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[8]
local now = now_ms()
local theirs, other = name_kind(now)
if other then
  return other
end
if theirs and family(theirs) ~= family(kind) then
  if theirs == 'RW' then
    return {-1, 0}
  end
  return {-1, (permit_of(family(theirs))) or 0}
end
local _, count = permit_of(kind)
if count and count > 1 then
  -- Marked for the clients that count every hold as one permit: they refuse the name.
  redis.call('HSET', TABLE, 'kind', family(kind) .. 'x')
elseif not theirs then
  redis.call('HSET', TABLE, 'kind', family(kind))
end
local function granted(token)
  redis.call(PUBLISH, ARGV[9], 'granted')
  return {1, token, 0}
end
-- Ours already (granted by a settle, or a re-sent request): the lease counts from now.
local entry = redis.call('HGET', TABLE, owner)
if entry and redis.call('ZSCORE', LOCK, owner) then
  redis.call('ZADD', LOCK, now + ttl, owner)
  extend(LOCK, ttl)
  extend(TABLE, ttl)
  leave(me)
  redis.call('HDEL', TABLE, 'q:' .. me)
  return {1, string.match(entry, ':(%d+)$'), 0}
end
settle(ARGV[7], ARGV[9], now)
if redis.call('ZSCORE', LOCK, owner) then
  -- Granted by the settle, in its place in the queue, on the grant's lease: the hold,
  -- the key and the table all keep this call's TTL, which the guard counts on.
  local token = string.match(redis.call('HGET', TABLE, owner), ':(%d+)$')
  redis.call('ZADD', LOCK, now + ttl, owner)
  extend(LOCK, ttl)
  extend(TABLE, ttl)
  return {1, token, 0}
end
local rank = redis.call('ZRANK', QUEUE, me)
if rank == false and redis.call('EXISTS', QUEUE) == 0 and granted_behind(kind, holder_kinds()) then
  return granted(hold(owner, kind, ttl, ARGV[6], now))
end
if ARGV[5] ~= '1' then
  return {0, first_expiry(now), 0, -1}
end
local waiting = kind .. ':' .. ARGV[2] .. ':' .. ARGV[6]
if ARGV[10] ~= nil and ARGV[10] ~= '' then
  waiting = kind .. ':' .. ARGV[11] .. ':' .. ARGV[6] .. ':' .. ARGV[10]
end
redis.call('HSET', TABLE, 'q:' .. me, waiting)
local stay = tonumber(ARGV[4])
local place = join(me, now, stay)
extend(TABLE, stay + 1000)
return {0, first_expiry(now), 0, place}
