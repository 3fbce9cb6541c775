-- Renews many locks of one client in one call.
-- KEYS: the lock key and the break mark of each hold, in pairs; ARGV: owner token, TTL
-- in milliseconds and leader hash ("" for a mutex; a candidate's entry is renewed with
-- its hold, see leader.lua) of each hold, in triples.
-- On Redis Cluster, where one call covers the holds of many hash slots (the script then
-- runs flagged allow-cross-slot-keys), the keys come first in ARGV instead (the lock key
-- and break mark of each hold, in pairs, then the triples), and KEYS holds at most the
-- lock key of a single hold, to route it through a redirection.
-- A shared kind's hold (the lock key a sorted set of holders, see shared.lua) passes its
-- holders' table in place of the leader hash.
-- Returns one status per hold: 1 renewed, 0 gone, -1 held by another owner, -2 removed
-- by a force release (the break mark is read only for a key that is not ours), -3 not
-- served by this cluster node (its slot moved or is moving: the client asks its owner).
-- The helper comes from broken.lua.
-- Renews `token`'s hold among the holders of a shared kind in sorted set `key` (owner
-- tokens by expiry in server ms) for `ttl` ms: the key and the holders' table `table`
-- are kept at least as long.
local function renew_shared(key, token, ttl, table, mark)
  local now = redis.call('TIME')
  now = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
  local expiry = redis.pcall('ZSCORE', key, token)
  if type(expiry) == 'string' and tonumber(expiry) > now then
    redis.call('ZADD', key, 'XX', now + ttl, token)
    for _, k in ipairs({key, table}) do
      local left = redis.call('PTTL', k)
      if left ~= -2 and left < ttl then
        redis.call('PEXPIRE', k, ttl)
      end
    end
    return 1
  elseif was_broken(mark, token) then
    return -2
  elseif type(expiry) == 'table' and expiry.err then
    return -1
  elseif redis.call('ZCOUNT', key, '(' .. now, '+inf') > 0 then
    return -1
  end
  return 0
end

local keys, at = KEYS, 0
if #KEYS < 2 then
  keys, at = ARGV, #ARGV / 5 * 2
end
local out = {}
for i = 1, (#ARGV - at) / 3 do
  local key, token = keys[2 * i - 1], ARGV[at + 3 * i - 2]
  local holder = redis.pcall('GET', key)
  if type(holder) == 'table' and not string.find(holder.err or '', 'WRONGTYPE', 1, true) then
    out[i] = -3
  elseif type(holder) == 'table' then
    -- A shared kind's holders (a sorted set, see shared.lua); the third argument of the
    -- triple is the holders' table.
    out[i] = renew_shared(key, token, tonumber(ARGV[at + 3 * i - 1]), ARGV[at + 3 * i], keys[2 * i])
  elseif holder == token then
    redis.call('PEXPIRE', key, ARGV[at + 3 * i - 1])
    local leader = ARGV[at + 3 * i]
    if leader ~= '' then
      redis.pcall('PEXPIRE', leader, ARGV[at + 3 * i - 1])
    end
    out[i] = 1
  else
    out[i] = not_ours(keys[2 * i], holder, token)
  end
end
return out
