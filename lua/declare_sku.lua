-- declare_sku.lua: seed a SKU's stock only if absent, or update its per-user limit.
--
-- KEYS[1]  the SKU state hash <prefix>:{<sku>}:state
-- KEYS[2]  the winners' journal <prefix>:{<sku>}:journal
-- ARGV[1]  mode: "seed" (the catalog has never seen Redis hold this SKU) or "update"
-- ARGV[2]  total units (used only when seeding)
-- ARGV[3]  per-user limit
-- ARGV[4]  the catalog row's declare id: the seed is stamped with it, so a declare whose
--          answer was lost recognises its own seed, and a state stamped by anyone else (a
--          catalog that was reset, a shared prefix) is never adopted
-- ARGV[5]  hold_ms, ARGV[6] offer_ms, ARGV[7] opens_ms, ARGV[8] closes_ms ("" for none)
-- ARGV[9]  the state sequence a seed starts from (optional, 0): shard i of a sharded SKU
--          starts at i << 36, so the sequences of its shards never meet (src/layout.rs)
--
-- Returns 1 when the stock was seeded now; 0 when the state was already there (only the limit,
-- the hold and offer times and the window changed); -1 in "update" mode when the state is missing (Redis lost it; see restore); -2 in
-- "seed" mode when a state stamped with another declare id is present (nothing changes).
--
-- Publishes KEYS[1] on <prefix>:units-back when it raises the stock (src/soldout/).
--
-- Keeps I1 and I4 (docs/invariants.md).
-- Invariant: stock is written only when the state hash does not exist, so a re-declare or a
-- restart of every gateway never re-sells units already sold, and stock nobody declared in
-- this catalog is never sold as this catalog's.
local state, journal = KEYS[1], KEYS[2]
local function terms()
  redis.call('HSET', state, 'limit', ARGV[3], 'hold_ms', ARGV[5], 'offer_ms', ARGV[6])
  for i, field in ipairs({'opens_ms', 'closes_ms'}) do
    if ARGV[6 + i] == '' then
      redis.call('HDEL', state, field)
    else
      redis.call('HSET', state, field, ARGV[6 + i])
    end
  end
end
if redis.call('EXISTS', state) == 1 then
  if ARGV[1] == 'seed' and redis.call('HGET', state, 'declare') ~= ARGV[4] then
    return -2
  end
  terms()
  return 0
end
if ARGV[1] ~= 'seed' then
  return -1
end
redis.call('HSET', state, 'stock', ARGV[2], 'inflight', 0, 'seq', ARGV[9] or 0, 'declare', ARGV[4])
terms()
-- The group starts at 0 so entries appended before any writer connects are still delivered.
pcall(redis.call, 'XGROUP', 'CREATE', journal, 'writers', '0', 'MKSTREAM')
-- Units may be back: every gateway's sold-out cache forgets this SKU (src/soldout/).
redis.call('PUBLISH', (string.gsub(KEYS[1], '{[^{]*$', 'units-back')), KEYS[1])
return 1
