-- transfer_out.lua: step 1 of a transfer between two shards of one SKU: take units out of the
-- donor shard's stock and record them as in transit (src/shards/transfer.rs).
--
-- KEYS[1]  the donor shard's state hash        <prefix>:{<sku>[#i]}:state
-- KEYS[2]  the donor's transfers not yet done   <prefix>:{<sku>[#i]}:xfer:out
-- ARGV[1]  the transfer id (UUIDv7 text, minted before the call)
-- ARGV[2]  units the recipient needs: the least worth taking (less is taken when the donor
--          holds less, so a drop's last units still move)
-- ARGV[3]  the most to take
-- ARGV[4]  the recipient shard's number
-- ARGV[5]  now, unix milliseconds (when the transfer began; the recovery task waits a while
--          before it finishes a transfer someone else may still be finishing)
-- ARGV[6]  "pool" to take from the donor's waitlist pool (`wl_pool`: units kept for the SKU's
--          lines, see lib/lifecycle.lua's give_back) instead of its stock; "" otherwise
-- ARGV[7]  floor: the donor's mark and incarnation in the ledger (see lib/fresh.lua, prepended)
--
-- Returns {1, units, generation} when units were taken now, {2, units, generation} when this
-- transfer id had taken them already (a resend: nothing changes), {0, stock, ""} when the
-- donor has nothing to give, {-1, 0, ""} when the donor's state is missing (Redis lost it),
-- {-3, 0, ""} when it is marked stale or older than the floor.
--
-- The record is "units|recipient|generation|created_ms|source" (source "pool" or ""; the
-- recipient puts pooled units in its own pool: transfer_in.lua): the generation is the donor state's
-- `gen` (stamped by restore; "" before any), and transfer_in.lua applies the units only to a
-- recipient of the same generation, so a transfer begun before a restore never adds units to
-- the state that restore rebuilt.
--
-- Keeps I1 and I4 (docs/invariants.md).
-- Invariant: stock (and the pool) never goes below 0; every unit taken out is, in the same step, counted in
-- the donor's `transfer_out` and recorded under the transfer id, so a crash after this call
-- loses none of them (the recovery task finishes the transfer); a transfer id takes units at
-- most once; the state's `seq` moves with the stock.
local state, pending, id = KEYS[1], KEYS[2], ARGV[1]
local prior = redis.call('HGET', pending, id)
if prior then
  local units, gen = string.match(prior, '^(%d+)|%d+|([^|]*)|')
  return {2, tonumber(units), gen}
end
local source = ARGV[6] or ''
local field = (source == 'pool') and 'wl_pool' or 'stock'
local unfit = state_unfit(ARGV[7])
if unfit then
  return {unfit == 'lost' and -1 or -3, 0, ''}
end
local head = redis.call('HMGET', state, 'stock', 'stale', 'seq', 'transfer_out', 'gen', 'wl_pool')
local stock = tonumber((source == 'pool') and (head[6] or '0') or head[1])
local need, cap = tonumber(ARGV[2]), tonumber(ARGV[3])
if stock <= 0 then
  return {0, stock, ''}
end
-- Half the donor's stock, at least what is needed, at most the cap and what it holds.
local take = math.min(stock, math.max(need, math.min(cap, math.ceil(stock / 2))))
redis.call('HSET', state, field, stock - take, 'seq', tonumber(head[3] or '0') + 1,
  'transfer_out', tonumber(head[4] or '0') + take)
redis.call('HSET', pending, id, take .. '|' .. ARGV[4] .. '|' .. (head[5] or '') .. '|' .. ARGV[5]
  .. '|' .. source)
return {1, take, head[5] or ''}
