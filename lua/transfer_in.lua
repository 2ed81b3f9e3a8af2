-- transfer_in.lua: step 2 of a transfer between two shards of one SKU: give the units a donor
-- took out (transfer_out.lua) back on the recipient shard, once per transfer id, through
-- give_back (lib/lifecycle.lua, prepended): into the recipient's pool while its line lease
-- lasts (src/shards/line.rs), else to its line's head first and the rest to open stock. Units
-- taken from a donor's pool go to the recipient's pool.
--
-- KEYS[1..9] the recipient shard's lifecycle keys (see lib/lifecycle.lua); KEYS[1] is its
--            state hash <prefix>:{<sku>[#i]}:state
-- KEYS[10]    the record that this transfer was applied here <prefix>:{<sku>[#i]}:xfer:in:<id>
-- ARGV[1]    units (as the donor's record has them)
-- ARGV[2]    the donor's generation when it took them (see transfer_out.lua)
-- ARGV[3]    how long the applied record is kept, seconds (far longer than any transfer can
--            stay pending while a gateway runs)
-- ARGV[4]    "pool" when the units came from the donor's waitlist pool: they go to this
--            shard's pool (`wl_pool`), to be offered to its line by offer_pool.lua; "" to
--            give them back (give_back: the line first, or the pool under a line lease)
-- ARGV[5]    floor: the recipient's mark and incarnation in the ledger (see lib/fresh.lua)
--
-- Returns 1 when the units were given back now, 2 when this transfer was applied before
-- (nothing changes), -4 when the recipient's generation differs (a restore rebuilt the SKU
-- since the units were taken: they are counted in its stock already, so they are never
-- added), -1 when the recipient's state is missing, -3 when it is marked stale or older
-- than the floor (nothing else changes in either case; the transfer stays pending until a restore ends it).
--
-- Publishes KEYS[1] on <prefix>:units-back when it raises the stock (give_back; src/soldout/).
--
-- Keeps I1 and I4 (docs/invariants.md).
-- Invariant: a transfer's units are given back at most once, and only to the generation of
-- the state they were taken from; pooled units stay kept for the SKU's lines; the state's
-- `seq` moves with every change journaled.
local state, applied = KEYS[1], KEYS[10]
if redis.call('EXISTS', applied) == 1 then
  return 2
end
local unfit = state_unfit(ARGV[5])
if unfit then
  return unfit == 'lost' and -1 or -3
end
local head = redis.call('HMGET', state, 'stock', 'stale', 'seq', 'gen')
if (head[4] or '') ~= ARGV[2] then
  return -4
end
local seq = tonumber(head[3] or '0') + 1
if (ARGV[4] or '') == 'pool' then
  redis.call('HINCRBY', state, 'wl_pool', tonumber(ARGV[1]))
else
  seq = give_back(tonumber(ARGV[1]), redis_now(), seq)
end
redis.call('HSET', state, 'seq', seq)
redis.call('SET', applied, ARGV[1], 'EX', ARGV[3])
return 1
