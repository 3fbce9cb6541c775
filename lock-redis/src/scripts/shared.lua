-- Shared kinds (a semaphore's permits, a read-write lock's readers and writers): the
-- helpers of their scripts (prepended in Rust, after tokens.lua, queue.lua and broken.lua).
-- KEYS[1]: the lock key, a sorted set: holders' owner tokens by the server time (ms) at
-- which each hold expires; KEYS[2]: the fencing counter; KEYS[3], KEYS[4]: the waiter
-- queue (see queue.lua); KEYS[5]: the holders' table, a hash: `<owner token>` ->
-- "<kind>:<fencing token>" of each holder, `q:<waiter id>` -> "<kind>:<lease ms>:<floor>"
-- of each queued waiter, with ":<round>" appended for one that takes grants (see
-- grant_head in queue.lua: its lease is the grant's, its client hears "grant <owner
-- token> <round> <fencing token>"), and `kind` -> the name's kind: "P<permits>" or "RW", or
-- "P<permits>x" once a hold of several permits came (so that a client of a version that
-- counts every hold as one permit refuses the name instead of over-granting).
-- A hold's kind is "R" (read), "W" (write), "U" (upgradeable read), "P<permits>" (a
-- permit) or "P<permits>x<count>" (`count` permits in one hold).
-- The grant rule is HoldKind::granted_behind's: a reader waits only for writers ahead
-- and passes one upgradeable reader ahead, never a second; an upgradeable reader waits
-- for anyone ahead but readers, a writer for everyone ahead, permits while the permits
-- ahead and their own count are no more than `permits`; nobody overtakes. An upgrade
-- turns "U" into "W" in place (rekind.lua): queued waiters are granted behind the
-- holders' kinds, so nobody joins it from then on.

local TABLE = KEYS[5]

-- A Lua number or decimal string as an exact decimal string.
local function decimal_of(n)
  if type(n) == 'number' then
    return string.format('%.0f', n)
  end
  return n
end

-- The permits and the count of a permit's kind ("P<permits>[x<count>]"); nil for another.
local function permit_of(kind)
  local permits, count = string.match(kind, '^P(%d+)x?(%d*)$')
  if not permits then
    return nil
  end
  return tonumber(permits), tonumber(count) or 1
end

-- The name's kind of a hold's kind (or of a name's): "RW" for a reader, an upgradeable
-- reader or a writer, "P<permits>" for permits (one or several per hold, the name marked
-- "P<permits>x" or not).
local function family(kind)
  if kind == 'R' or kind == 'W' or kind == 'U' or kind == 'RW' then
    return 'RW'
  end
  return string.match(kind, '^(P%d+)') or kind
end

-- Whether `kind` is granted behind `ahead`, the kinds before it in queue order.
local function granted_behind(kind, ahead)
  local permits, count = permit_of(kind)
  local taken, upgradeable = 0, false
  for _, other in ipairs(ahead) do
    local _, weight = permit_of(other)
    local shares = (kind == 'R' and other == 'R') or (kind == 'U' and other == 'R')
      or (permits ~= nil and weight ~= nil)
    if kind == 'R' and other == 'U' then
      -- Only the first upgradeable reader ahead holds; the second waits.
      shares = not upgradeable
      upgradeable = true
    end
    if not shares then
      return false
    end
    taken = taken + (weight or 1)
  end
  if permits then
    return taken + count <= permits
  end
  return true
end

-- `kind` rewritten by a resize to `to` permits (see HoldKind's SemaphoreResize::rewrite):
-- the count kept, or all `to` for the reservation; nil when it is no permit of `from` or
-- `to`, or takes more than `to`.
local function resized(kind, from, to, reserved)
  local permits, count = permit_of(kind)
  if permits ~= from and permits ~= to then
    return nil
  end
  if reserved then
    count = to
  end
  if count > to then
    return nil
  end
  if count == 1 then
    return 'P' .. to
  end
  return 'P' .. to .. 'x' .. count
end

-- Sets the expiry of `key` to `ms` from now unless it expires later already.
local function extend(key, ms)
  local left = redis.call('PTTL', key)
  if left ~= -2 and left < ms then
    redis.call('PEXPIRE', key, ms)
  end
end

-- Drops the holders whose hold expired (a crashed holder frees its place here).
local function purge(now)
  local dead = redis.call('ZRANGEBYSCORE', LOCK, '-inf', now)
  if #dead > 0 then
    redis.call('ZREMRANGEBYSCORE', LOCK, '-inf', now)
    redis.call('HDEL', TABLE, unpack(dead))
  end
end

-- The kinds of the live holders (an entry without a kind counts as a writer).
local function holder_kinds()
  local kinds = {}
  for _, owner in ipairs(redis.call('ZRANGE', LOCK, 0, -1)) do
    local entry = redis.call('HGET', TABLE, owner)
    kinds[#kinds + 1] = entry and string.match(entry, '^([^:]*)') or 'W'
  end
  return kinds
end

-- Makes `owner` a holder of `kind` for `ttl` ms with the next fencing token (no lower
-- than `floor`, see tokens.lua) and returns the token.
local function hold(owner, kind, ttl, floor, now)
  local token = decimal_of(next_token(floor))
  redis.call('ZADD', LOCK, now + ttl, owner)
  redis.call('HSET', TABLE, owner, kind .. ':' .. token)
  extend(LOCK, ttl)
  extend(TABLE, ttl)
  return token
end

-- Grants, in queue order, the waiters at the head of the queue that the holders admit
-- (at most 64 per call), as the holds of their owner tokens, and tells each: one that
-- takes grants holds from here, another's next call finds itself a holder. A waiter past its liveness deadline is dropped instead; one
-- of unknown kind (a mutex's) stops the grants.
local function settle(channel_prefix, changed, now)
  local ahead = holder_kinds()
  local granted = 0
  for _, id in ipairs(redis.call('ZRANGE', QUEUE, 0, 63)) do
    local entry = redis.call('HGET', TABLE, 'q:' .. id)
    local client, owner = string.match(id, '^([^/]*)/(.*)$')
    if not entry or not client then
      break
    end
    if tonumber(redis.call('ZSCORE', LIVE, id) or '0') <= now then
      -- A waiter that stopped showing up is dropped, not granted (evict drops only 16
      -- per call).
      leave(id)
      redis.call('HDEL', TABLE, 'q:' .. id)
    else
      local kind, ttl, floor, round = string.match(entry, '^([^:]*):(%d+):([^:]*):?(%d*)$')
      if not kind or not granted_behind(kind, ahead) then
        break
      end
      local token = hold(owner, kind, tonumber(ttl), floor, now)
      leave(id)
      redis.call('HDEL', TABLE, 'q:' .. id)
      if round ~= '' then
        redis.call(PUBLISH, channel_prefix .. client, 'grant ' .. owner .. ' ' .. round .. ' ' .. token)
      else
        redis.call(PUBLISH, channel_prefix .. client, 'wake ' .. owner)
      end
      ahead[#ahead + 1] = kind
      granted = granted + 1
    end
  end
  if granted > 0 and changed ~= '' then
    redis.call(PUBLISH, changed, 'granted')
  end
end

-- The name's kind once the expired holders and waiters are gone: its table's `kind`, nil
-- when nobody holds or waits (the kind then goes with them); or, second, the reply for a
-- name of another kind: {-1, -1} for a mutex's or an election's (a plain string key, or
-- waiters without a kind).
local function name_kind(now)
  local found = redis.call('TYPE', LOCK)['ok']
  if found ~= 'none' and found ~= 'zset' then
    return nil, {-1, -1}
  end
  evict(now, TABLE)
  purge(now)
  if redis.call('EXISTS', LOCK) == 0 and redis.call('EXISTS', QUEUE) == 0 then
    redis.call('DEL', TABLE)
  end
  local theirs = redis.call('HGET', TABLE, 'kind')
  if not theirs and redis.call('EXISTS', QUEUE) == 1 then
    local head = redis.call('ZRANGE', QUEUE, 0, 0)[1]
    if head and redis.call('HEXISTS', TABLE, 'q:' .. head) == 0 then
      return nil, {-1, -1}
    end
  end
  return theirs, nil
end

-- How long (ms) until the first live hold expires; -2 when nobody holds.
local function first_expiry(now)
  local first = redis.call('ZRANGE', LOCK, 0, 0, 'WITHSCORES')
  if first[2] == nil then
    return -2
  end
  return math.max(tonumber(first[2]) - now, 0)
end

-- Why `owner` holds nothing here: -2 broken by an operator, -1 others hold, 0 gone.
local function not_held(mark, owner)
  if was_broken(mark, owner) then
    return -2
  elseif redis.call('TYPE', LOCK)['ok'] ~= 'none' then
    return -1
  end
  return 0
end

