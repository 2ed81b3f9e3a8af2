-- declare_sku.lua: seed a SKU's stock only if absent, or update its per-user limit.
--
-- KEYS[1]  the SKU state hash <prefix>:{<sku>}:state
-- KEYS[2]  the winners' journal <prefix>:{<sku>}:journal
-- ARGV[1]  mode: "seed" (the catalog row is new) or "update" (the SKU already existed)
-- ARGV[2]  total units (used only when seeding)
-- ARGV[3]  per-user limit
--
-- Returns 1 when the stock was seeded now, 0 when the state was already there (only the limit
-- changed), -1 in "update" mode when the state is missing (Redis lost it; see restore).
--
-- Invariant: stock is written only when the state hash does not exist, so a re-declare or a
-- restart of every gateway never re-sells units already sold.
local state, journal = KEYS[1], KEYS[2]
if redis.call('EXISTS', state) == 1 then
  redis.call('HSET', state, 'limit', ARGV[3])
  return 0
end
if ARGV[1] ~= 'seed' then
  return -1
end
redis.call('HSET', state, 'stock', ARGV[2], 'limit', ARGV[3], 'inflight', 0)
-- The group starts at 0 so entries appended before any writer connects are still delivered.
pcall(redis.call, 'XGROUP', 'CREATE', journal, 'writers', '0', 'MKSTREAM')
return 1
