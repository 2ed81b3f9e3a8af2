-- finish_transfer.lua: step 3 of a transfer between two shards of one SKU: on the donor, forget
-- a transfer the recipient has applied (or refused for good: another generation).
--
-- KEYS[1]  the donor shard's state hash          <prefix>:{<sku>[#i]}:state
-- KEYS[2]  the donor's transfers not yet done     <prefix>:{<sku>[#i]}:xfer:out
-- ARGV[1]  the transfer id
--
-- Returns 1 when the record was removed now, 0 when there was none (finished before).
--
-- Keeps I1 (docs/invariants.md).
-- Invariant: called only once transfer_in.lua answered for this id (applied, or never
-- applicable), so the units leave `transfer_out` only when they are in the recipient's stock
-- (or were never to be); the stock does not move here, so `seq` does not either.
local state, pending, id = KEYS[1], KEYS[2], ARGV[1]
local rec = redis.call('HGET', pending, id)
if not rec then
  return 0
end
redis.call('HDEL', pending, id)
local units = tonumber(string.match(rec, '^(%d+)|'))
local out = tonumber(redis.call('HGET', state, 'transfer_out') or '0')
if redis.call('EXISTS', state) == 1 then
  redis.call('HSET', state, 'transfer_out', math.max(0, out - units))
end
return 1
