-- close_sku.lua: close a SKU for a restore (claims then fail closed), unless a newer operator
-- action has touched its state.
--
-- KEYS[1]  the SKU state hash <prefix>:{<sku>}:state
-- ARGV[1]  the restore's operator epoch
--
-- Returns 1 when the state is gone now (deleted here, or already absent), -4 when a newer
-- operator action touched the state (this restore lost its lock: nothing changes).
--
-- Keeps I1 (docs/invariants.md).
-- Invariant: a restore whose lock is gone never throws away a state a newer operator action
-- (a restock, another restore) has moved since, so it cannot rebuild from a total that action
-- has changed under it.
local e = redis.call('HGET', KEYS[1], 'epoch')
if e and tonumber(e) > tonumber(ARGV[1]) then
  return -4
end
redis.call('DEL', KEYS[1])
return 1
