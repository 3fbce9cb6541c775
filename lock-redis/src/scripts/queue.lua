-- The waiter queue of a lock: the helpers the queue scripts start with (prepended in Rust,
-- after tokens.lua).
-- KEYS[1]: the lock key; KEYS[2]: its fencing counter; KEYS[3]: the queue, waiter ids by
-- arrival ticket; KEYS[4]: the liveness deadlines, the same ids by the server time (ms)
-- after which a waiter that has not shown up again is dropped.
-- A waiter id is "<client id>/<owner token>"; a client hears its waiters' wake-ups on the
-- channel "<channel prefix><client id>" as "wake <owner token>" or "standby <owner token>",
-- and grants as "grant <owner token> <round> <fencing token>".
-- Grants: the hash "<queue key>grant" (same hash slot) holds, for each waiter that asked
-- to be handed the lock by a release, "<round>:<lease ms>:<floor>": its latest queued
-- attempt, the lease of the grant and its fencing token's floor, and for a candidate of
-- an election ":<value>" after them (see grant_head). It is
-- not declared: on Redis Cluster, one the node cannot serve now (its slot migrating) is
-- read as empty and left to its expiry (pcall), and its waiters are woken instead.
--
-- Safety never rests on the queue: the lock is the plain key, taken with SET NX semantics.
-- The queue decides only who may take a free key, so a lost, stale or damaged queue costs
-- order or latency, never exclusion.

local LOCK, QUEUE, LIVE = KEYS[1], KEYS[3], KEYS[4]
local GRANTS = QUEUE .. 'grant'

-- The server clock in milliseconds, and in microseconds.
local function now_ms()
  local now = redis.call('TIME')
  local seconds, micros = tonumber(now[1]), tonumber(now[2])
  return seconds * 1000 + math.floor(micros / 1000), seconds * 1000000 + micros
end

-- Drops up to 16 waiters whose deadline has passed (bounded work per call; any later call
-- drops more), and a head without a deadline (left by a partial loss of the keys). With
-- `fields`, a shared kind's holders' table (see shared.lua), their `q:<id>` entries too.
local function evict(now, fields)
  local function drop(ids)
    redis.call('ZREM', QUEUE, unpack(ids))
    redis.call('ZREM', LIVE, unpack(ids))
    redis.pcall('HDEL', GRANTS, unpack(ids))
    if fields then
      for i, id in ipairs(ids) do
        ids[i] = 'q:' .. id
      end
      redis.call('HDEL', fields, unpack(ids))
    end
  end
  local dead = redis.call('ZRANGEBYSCORE', LIVE, '-inf', now, 'LIMIT', 0, 16)
  if #dead > 0 then
    drop(dead)
  end
  local head = redis.call('ZRANGE', QUEUE, 0, 0)[1]
  if head and not redis.call('ZSCORE', LIVE, head) then
    drop({head})
  end
end

-- Queues waiter `id` at the tail (unless it is queued already) and keeps it for `stay`
-- ms from `now`; with `grant` ("<round>:<lease ms>:<floor>", or '' for none) a release
-- may hand it the lock. Returns its place (0 = head).
local function join(id, now, stay, grant)
  if not redis.call('ZSCORE', QUEUE, id) then
    local last = redis.call('ZRANGE', QUEUE, -1, -1, 'WITHSCORES')
    local ticket = 1
    if last[2] then
      ticket = tonumber(last[2]) + 1
    end
    redis.call('ZADD', QUEUE, ticket, id)
  end
  redis.call('ZADD', LIVE, now + stay, id)
  -- An abandoned queue outlives its last deadline by at most a second.
  redis.call('PEXPIRE', QUEUE, stay + 1000)
  redis.call('PEXPIRE', LIVE, stay + 1000)
  if grant ~= nil and grant ~= '' then
    redis.pcall('HSET', GRANTS, id, grant)
    redis.pcall('PEXPIRE', GRANTS, stay + 1000)
  end
  return redis.call('ZRANK', QUEUE, id)
end

-- Drops waiter `id` from the queue.
local function leave(id)
  redis.call('ZREM', QUEUE, id)
  redis.call('ZREM', LIVE, id)
  redis.pcall('HDEL', GRANTS, id)
end

-- Hands the free lock to the head of the queue when it asked for grants and is alive:
-- the lock key becomes its owner token for the grant's lease, it takes the next fencing
-- token (no lower than its floor) and leaves the queue, and its client hears "grant
-- <owner token> <round> <token>". The head bounds the lease from the send time of its
-- queued attempt `round` (which the grant follows); one that no longer waits on that
-- round re-checks instead, finding the lock its own. Returns whether it granted: not
-- when the head did not ask or is past its deadline (`evict` then drops it). `now` and
-- `now_us` are the server clock (see now_ms). Needs tokens.lua and leader.lua before it.
local function grant_head(channel_prefix, now, now_us)
  local head = redis.call('ZRANGE', QUEUE, 0, 0)[1]
  if head == nil then
    return false
  end
  local grant = redis.pcall('HGET', GRANTS, head)
  if type(grant) ~= 'string' or tonumber(redis.call('ZSCORE', LIVE, head) or '0') <= now then
    return false
  end
  local round, lease, floor, value = string.match(grant, '^(%d+):(%d+):([^:]*):(.*)$')
  if not round then
    round, lease, floor = string.match(grant, '^(%d+):(%d+):([^:]*)$')
  end
  local client, token = string.match(head, '^([^/]*)/(.*)$')
  if not round or not client then
    return false
  end
  -- On Redis Cluster a node may not create a key of a slot that is migrating (it may be on
  -- the new primary already): then the head is woken instead.
  local set = redis.pcall('SET', LOCK, token, 'PX', lease)
  if type(set) == 'table' and set.err then
    return false
  end
  local taken, fence = pcall(next_token, floor, now_us)
  if not taken then
    redis.call('DEL', LOCK)
    return false
  end
  if type(fence) == 'number' then
    fence = string.format('%.0f', fence)
  end
  if value then
    -- A candidate: its entry and the observers' notice come with the grant. The leader
    -- hash and change channel sit beside the queue ("<prefix>{<lock key>}:" + suffix).
    local base = string.sub(QUEUE, 1, -2)
    elect(base .. 'leader', token, value, fence, lease, base .. 'changed')
  end
  leave(head)
  redis.call(PUBLISH, channel_prefix .. client, 'grant ' .. token .. ' ' .. round .. ' ' .. fence)
  return true
end

-- Wakes the head of the queue, which then has `window` ms to take the lock before it is
-- dropped, and tells the waiter behind it to stand by (to take over should the head not
-- come). With `unless_woken`, a head already being woken (its deadline within the window)
-- is left to it and nobody is told anything.
local function wake_head(channel_prefix, window, now, unless_woken)
  local first = redis.call('ZRANGE', QUEUE, 0, 1)
  if #first == 0 then
    return
  end
  local deadline = tonumber(redis.call('ZSCORE', LIVE, first[1]) or '0')
  if deadline > now + window then
    redis.call('ZADD', LIVE, now + window, first[1])
  elseif unless_woken then
    return
  end
  for i, id in ipairs(first) do
    local client, token = string.match(id, '^([^/]*)/(.*)$')
    if client then
      if i == 1 then
        redis.call(PUBLISH, channel_prefix .. client, 'wake ' .. token)
      else
        redis.call(PUBLISH, channel_prefix .. client, 'standby ' .. token)
      end
    end
  end
end

