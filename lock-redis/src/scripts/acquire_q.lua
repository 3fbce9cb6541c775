-- Takes a lock in arrival order: as acquire.lua, but a free key goes only to the head of
-- the queue (or to anyone while nobody queues), and a refused waiter joins the queue or,
-- already in it, shows it is alive.
-- KEYS: as in queue.lua (lock, fencing counter, queue, liveness)
-- ARGV[1]: owner token; ARGV[2]: TTL in milliseconds
-- ARGV[3]: "1" to take the next fencing token (single server), "0" to read it (RedLock)
-- ARGV[4]: waiter id; ARGV[5]: how long (ms) the waiter stays queued without showing up
-- ARGV[6]: "1" to queue when refused, "0" not to (a try)
-- ARGV[7]: the floor of the fencing token, "" for none (see tokens.lua)
-- ARGV[8]: channel prefix of the clients' wake-up channels
-- ARGV[9]: how long (ms) a woken head has to take the lock
-- A candidate of an election also passes KEYS[5]: its leader hash; ARGV[10]: its value;
-- ARGV[11]: the election's change channel (see leader.lua).
-- ARGV[12]: for a waiter a release may hand the lock to, "<round>:<lease ms>:<floor>" (see
-- grant_head in queue.lua), else "" or nothing.
-- Returns {1, fencing token, 0} (single server) or {1, 0, reading} (RedLock) when the
-- lock is ours; {0, PTTL of the holder (-2 when the key is free but others are ahead),
-- reading or 0, place in the queue (0 = head; -1 not queued)} when it is not.
-- {-1, what the name is (its permits, 0 for a read-write lock)} when a semaphore or a
-- read-write lock holds it.
-- A re-sent request (its reply was lost) finds the lock ours, with the token it took, or
-- keeps its ticket; so does a waiter a release handed the lock to (see grant_head).
-- The helpers come from tokens.lua, kinds.lua, queue.lua and leader.lua.

-- The reply of a grant, with the candidate's entry stored. `held`: the key was this
-- owner's already (handed to it by a release, or taken by a request whose reply was
-- lost): it keeps the token of that grant (see held_token).
local function granted(held)
  if ARGV[3] == '1' then
    local token
    if held then
      token = held_token(ARGV[7])
    else
      token = next_token(ARGV[7])
    end
    elect(KEYS[5], ARGV[1], ARGV[10], token, ARGV[2], ARGV[11])
    return {1, token, 0}
  end
  elect(KEYS[5], ARGV[1], ARGV[10], nil, ARGV[2], ARGV[11])
  return {1, 0, reading(ARGV[7])}
end

-- While nobody queues, a free key is granted at once, as cheaply as acquire.lua. A
-- mutex on one server took this path in fast_acquire.lua already; here come the cases
-- that need the helpers: a candidate's entry, RedLock's reading.
if redis.call('EXISTS', QUEUE) == 0 and redis.call('SET', LOCK, ARGV[1], 'NX', 'PX', ARGV[2]) then
  return granted()
end
local theirs = shared_kind()
if theirs then
  return {-1, theirs}
end
local now = now_ms()
evict(now)
local me = ARGV[4]
local holder = redis.call('GET', LOCK)
local mine = holder == ARGV[1]
local held = mine
if mine then
  redis.call('PEXPIRE', LOCK, ARGV[2])
elseif holder == false then
  local head = redis.call('ZRANGE', QUEUE, 0, 0)[1]
  if head == nil or head == me then
    redis.call('SET', LOCK, ARGV[1], 'PX', ARGV[2])
    mine = true
  else
    -- Free behind a head that nobody woke (the holder's key expired, or the head woken
    -- by the release did not come and its stand-by neither): wake it as a release does,
    -- so that a dead head is passed over within a window, not when its entry expires.
    wake_head(ARGV[8], tonumber(ARGV[9]), now, true)
  end
end
if mine then
  leave(me)
  return granted(held)
end
local read = 0
if ARGV[3] ~= '1' then
  read = reading(ARGV[7])
end
local pttl = redis.call('PTTL', LOCK)
if ARGV[6] ~= '1' then
  return {0, pttl, read, -1}
end
return {0, pttl, read, join(me, now, tonumber(ARGV[5]), ARGV[12])}
