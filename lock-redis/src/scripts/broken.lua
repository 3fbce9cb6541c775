-- Broken holds: the helpers the renew and release scripts start with (prepended in Rust).
-- An operator's force release (break.lua) keeps the owner tokens it removed from a lock
-- key in a list beside it, the break mark, for a while (see KeyLayout).

-- Whether a force release removed `token` from its lock key: the break mark `mark`
-- lists it (at most a few entries). Only asked when the lock key is not `token`'s. Read
-- with pcall: on Redis Cluster, where the mark may be undeclared, a mark that the node
-- cannot serve now (its slot migrating) reads as empty.
local function was_broken(mark, token)
  for _, removed in ipairs(redis.pcall('LRANGE', mark, 0, -1)) do
    if removed == token then
      return true
    end
  end
  return false
end

-- The status of the hold of `token` whose lock key holds `holder` instead (false: the
-- key is gone): -2 when a force release removed it (the break mark `mark` lists it), 0
-- when the key is gone, -1 when another owner holds it.
local function not_ours(mark, holder, token)
  if was_broken(mark, token) then
    return -2
  elseif holder == false then
    return 0
  end
  return -1
end
