-- restore_sku.lua: rebuild a SKU's state from the ledger after Redis lost it.
--
-- KEYS[1]  the SKU state hash <prefix>:{<sku>}:state
-- KEYS[2]  per-user unit counts <prefix>:{<sku>}:users
-- KEYS[3]  the winners' journal <prefix>:{<sku>}:journal
-- ARGV[1]  stock according to the ledger: total - live claims (written or pending)
-- ARGV[2]  per-user limit
-- ARGV[2k+1], ARGV[2k+2] for k >= 1: a user id and the units the ledger says they hold
--
-- Returns 1 when restored, 0 when a state is present (nothing changes).
--
-- Invariant: the state hash is written last and only when absent: claims stay closed (fail
-- closed) until stock, counts and the journal's group are all back. The caller has waited for
-- the journal to be empty, so the ledger it read holds every winner.
local state, users, journal = KEYS[1], KEYS[2], KEYS[3]
if redis.call('EXISTS', state) == 1 then
  return 0
end
redis.call('DEL', users)
for i = 3, #ARGV, 2 do
  redis.call('HSET', users, ARGV[i], ARGV[i + 1])
end
pcall(redis.call, 'XGROUP', 'CREATE', journal, 'writers', '0', 'MKSTREAM')
redis.call('HSET', state, 'stock', ARGV[1], 'limit', ARGV[2], 'inflight', 0)
return 1
