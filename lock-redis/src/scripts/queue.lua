-- The waiter queue of a lock: the helpers the queue scripts start with (prepended in Rust,
-- after tokens.lua).
-- KEYS[1]: the lock key; KEYS[2]: its fencing counter; KEYS[3]: the queue, waiter ids by
-- arrival ticket; KEYS[4]: the liveness deadlines, the same ids by the server time (ms)
-- after which a waiter that has not shown up again is dropped.
-- A waiter id is "<client id>/<owner token>"; a client hears its waiters' wake-ups on the
-- channel "<channel prefix><client id>" as "wake <owner token>" or "standby <owner token>".
--
-- Safety never rests on the queue: the lock is the plain key, taken with SET NX semantics.
-- The queue decides only who may take a free key, so a lost, stale or damaged queue costs
-- order or latency, never exclusion.

local LOCK, QUEUE, LIVE = KEYS[1], KEYS[3], KEYS[4]

-- The server clock in milliseconds.
local function now_ms()
  local now = redis.call('TIME')
  return tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
end

-- Drops up to 16 waiters whose deadline has passed (bounded work per call; any later call
-- drops more), and a head without a deadline (left by a partial loss of the keys).
local function evict(now)
  local dead = redis.call('ZRANGEBYSCORE', LIVE, '-inf', now, 'LIMIT', 0, 16)
  if #dead > 0 then
    redis.call('ZREM', QUEUE, unpack(dead))
    redis.call('ZREM', LIVE, unpack(dead))
  end
  local head = redis.call('ZRANGE', QUEUE, 0, 0)[1]
  if head and not redis.call('ZSCORE', LIVE, head) then
    redis.call('ZREM', QUEUE, head)
  end
end

-- Queues waiter `id` at the tail (unless it is queued already) and keeps it for `stay`
-- ms from `now`; returns its place (0 = head).
local function join(id, now, stay)
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
  return redis.call('ZRANK', QUEUE, id)
end

-- Drops waiter `id` from the queue.
local function leave(id)
  redis.call('ZREM', QUEUE, id)
  redis.call('ZREM', LIVE, id)
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

