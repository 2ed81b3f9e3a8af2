-- restore_sku.lua: rebuild a SKU's state from the ledger after Redis lost it (or came back
-- with older data).
--
-- KEYS[1]  the SKU state hash <prefix>:{<sku>}:state
-- KEYS[2]  per-user unit counts <prefix>:{<sku>}:users
-- KEYS[3]  the winners' journal <prefix>:{<sku>}:journal
-- KEYS[4]  the per-user counts staged by the caller in chunks <prefix>:{<sku>}:users:restore
-- ARGV[1]  stock according to the ledger: total - live claims (written or pending)
-- ARGV[2]  per-user limit
-- ARGV[3]  the state sequence to start from (above every sequence PostgreSQL recorded)
-- ARGV[4]  the catalog row's declare id
-- ARGV[5]  the restore's operator epoch, stamped on the state
-- ARGV[6]  hold_ms, ARGV[7] offer_ms, ARGV[8] opens_ms, ARGV[9] closes_ms ("" for none): the
--          SKU's terms, so no claim decides on a state without them
-- ARGV[10] the waitlist's highest join order (the caller restored the line before this call)
-- KEYS[5]  the SKU's operator fence <prefix>:{<sku>}:op_fence (lua/restock.lua raises it when
--          a restock finds the state missing)
-- KEYS[6]  (a shard of a sharded SKU only) the shard's transfers not yet done, dropped: the
--          stock is rebuilt from the ledger, units in transit included
-- ARGV[11] (with KEYS[6]) the generation stamped on the state (`gen`), so no transfer begun
--          before this restore is ever applied to it (lua/transfer_in.lua); "" otherwise
-- ARGV[12] (optional) a seated SKU's rows, "offset:count:prefix;..." (lua/seat_rows.lua):
--          written with the state, so no offer is ever made on it without them
--
-- The state's incarnation (`inc`, see lib/fresh.lua) is Redis's now: above every incarnation
-- a rotation of the state it replaces could still get recorded, so no gateway's floor is
-- above the rebuilt state.
--
-- Returns 1 when restored, 0 when a state is present, -4 when the operator fence is newer than
-- ARGV[5]: a restock moved the total after this restore read it (nothing changes in either).
--
-- Publishes KEYS[1] on <prefix>:units-back when it raises the stock (src/soldout/).
--
-- Keeps I1 and I3 (docs/invariants.md).
-- Invariant: the state hash is written last and only when absent: claims stay closed (fail
-- closed) until stock, counts and the journal's group are all back. The caller has waited for
-- the journal to be empty, so the ledger it read holds every winner. The counts are staged
-- under another key and moved in one step, so no claim ever sees half of them.
local state, users, journal, staged = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
if redis.call('EXISTS', state) == 1 then
  return 0
end
if tonumber(redis.call('GET', KEYS[5]) or '0') > tonumber(ARGV[5]) then
  redis.call('DEL', staged)
  return -4
end
if redis.call('EXISTS', staged) == 1 then
  redis.call('RENAME', staged, users)
else
  redis.call('DEL', users)
end
pcall(redis.call, 'XGROUP', 'CREATE', journal, 'writers', '0', 'MKSTREAM')
redis.call('HSET', state, 'stock', ARGV[1], 'limit', ARGV[2], 'inflight', 0, 'seq', ARGV[3],
  'declare', ARGV[4], 'epoch', ARGV[5], 'hold_ms', ARGV[6], 'offer_ms', ARGV[7],
  'wl_order', ARGV[10])
local t = redis.call('TIME')
redis.call('HSET', state, 'inc', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
if KEYS[6] then
  redis.call('DEL', KEYS[6])
  redis.call('HSET', state, 'gen', ARGV[11], 'transfer_out', 0)
end
if ARGV[12] and ARGV[12] ~= '' then redis.call('HSET', state, 'rows', ARGV[12]) end
if ARGV[8] ~= '' then redis.call('HSET', state, 'opens_ms', ARGV[8]) end
if ARGV[9] ~= '' then redis.call('HSET', state, 'closes_ms', ARGV[9]) end
-- Units may be back: every gateway's sold-out cache forgets this SKU (src/soldout/).
redis.call('PUBLISH', (string.gsub(KEYS[1], '{[^{]*$', 'units-back')), KEYS[1])
return 1
