-- transfer_in.lua: step 2 of a transfer between two shards of one SKU: add the units a donor
-- took out (transfer_out.lua) to the recipient shard's stock, once per transfer id.
--
-- KEYS[1]  the recipient shard's state hash              <prefix>:{<sku>[#i]}:state
-- KEYS[2]  the record that this transfer was applied here <prefix>:{<sku>[#i]}:xfer:in:<id>
-- ARGV[1]  units (as the donor's record has them)
-- ARGV[2]  the donor's generation when it took them (see transfer_out.lua)
-- ARGV[3]  how long the applied record is kept, seconds (far longer than any transfer can
--          stay pending while a gateway runs)
--
-- Returns 1 when the units were added now, 2 when this transfer was applied before (nothing
-- changes), -4 when the recipient's generation differs (a restore rebuilt the SKU since the
-- units were taken: they are counted in its stock already, so they are never added), -1 when
-- the recipient's state is missing, -3 when it is marked stale (nothing changes in either
-- case; the transfer stays pending until a restore ends it).
--
-- Publishes KEYS[1] on <prefix>:units-back when it raises the stock (src/soldout.rs).
--
-- Invariant: a transfer's units are added at most once, and only to the generation of the
-- state they were taken from; the state's `seq` moves with the stock.
local state, applied = KEYS[1], KEYS[2]
if redis.call('EXISTS', applied) == 1 then
  return 2
end
local head = redis.call('HMGET', state, 'stock', 'stale', 'seq', 'gen')
if not head[1] then
  return -1
end
if head[2] then
  return -3
end
if (head[4] or '') ~= ARGV[2] then
  return -4
end
redis.call('HSET', state, 'stock', tonumber(head[1]) + tonumber(ARGV[1]),
  'seq', tonumber(head[3] or '0') + 1)
redis.call('SET', applied, ARGV[1], 'EX', ARGV[3])
-- Units are back on this shard: every gateway's sold-out cache forgets the SKU.
redis.call('PUBLISH', (string.gsub(KEYS[1], '{[^{]*$', 'units-back')), KEYS[1])
return 1
