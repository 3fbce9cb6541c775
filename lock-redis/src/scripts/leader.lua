-- Leader elections: the helpers of the scripts that grant, renew, release or break a
-- candidate's hold (prepended in Rust, after the PUBLISH command).
-- A candidate's entry is the leader hash beside the lock key (see KeyLayout): `owner`
-- (the owner token in the lock key), `term` (the fencing token of the grant), `value`,
-- `version` (0 at the grant, raised by each proclaim) and `since` (the server time of the
-- grant in ms), with the lock key's TTL.
-- Readers trust it only while `owner` is the lock key's value. Every change of the
-- leader is published on the election's change channel.

-- A Lua number or decimal string as an exact decimal string.
local function decimal(n)
  if type(n) == 'number' then
    return string.format('%.0f', n)
  end
  return n
end

-- Stores the entry of candidate `owner` in leader hash `leader` (nothing for '' or nil:
-- not a candidate) with `value`, version 0, the server time and `term` for `ttl` ms, and
-- publishes the grant on `channel`. Without a term (RedLock's first round, which does not
-- know it yet) the entry is stored without one and nothing is published (the fencing
-- write adds the term and publishes).
local function elect(leader, owner, value, term, ttl, channel)
  if leader == nil or leader == '' then
    return
  end
  redis.call('DEL', leader)
  local now = redis.call('TIME')
  local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
  local since = string.format('%.0f', ms)
  redis.call('HSET', leader, 'owner', owner, 'value', value, 'version', 0, 'since', since)
  redis.call('PEXPIRE', leader, ttl)
  if term ~= nil then
    redis.call('HSET', leader, 'term', decimal(term))
    redis.call(PUBLISH, channel, 'elected')
  end
end

-- Removes the entry of `owner` from leader hash `leader` ('' for none) and, when
-- `publish` and there was one, publishes it on `channel`. Read with pcall: on Redis
-- Cluster, where the entry is undeclared, one that the node cannot serve now (its slot
-- migrating) is left to its TTL.
local function resign(leader, owner, channel, publish)
  if leader == nil or leader == '' then
    return
  end
  if redis.pcall('HGET', leader, 'owner') == owner then
    redis.call('DEL', leader)
    if publish then
      redis.call(PUBLISH, channel, 'resigned')
    end
  end
end

