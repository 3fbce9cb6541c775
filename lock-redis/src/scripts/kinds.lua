-- What a name is when a semaphore or a read-write lock holds it: the helper of the mutex
-- acquires (prepended in Rust), which meet such a name with a typed conflict, never a
-- server error. KEYS[1] is the lock key, KEYS[2] its fencing counter.

-- The code of the shared kind holding the name (its permits, 0 for a read-write lock;
-- see kind_named in layout.rs), nil when no shared kind does. Its holders are a sorted
-- set (see shared.lua); its table beside the fencing counter names the kind.
local function shared_kind()
  if redis.call('TYPE', KEYS[1])['ok'] ~= 'zset' then
    return nil
  end
  local kind = redis.pcall('HGET', string.sub(KEYS[2], 1, -6) .. 'holders', 'kind')
  if kind == 'RW' then
    return 0
  end
  return tonumber(string.match(type(kind) == 'string' and kind or '', '^P(%d+)')) or 0
end
