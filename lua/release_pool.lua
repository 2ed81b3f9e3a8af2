-- release_pool.lua: give a shard's waitlist pool back once its line lease has lapsed (nobody
-- waits in any of the SKU's lines, and no buyer has begun a join within the lease).
--
-- KEYS[1..9] the shard's lifecycle keys (see lib/lifecycle.lua)
-- ARGV[1]    floor: the ledger's mark and incarnation (see lib/fresh.lua)
--
-- Returns {1, units released} when the lease has lapsed (0 units when the pool was empty);
-- {0, pool} when the lease still lasts (nothing changes); {-1, 0} when the state is missing,
-- {-3, 0} when it is marked stale or older than the floor.
--
-- Publishes KEYS[1] on <prefix>:units-back when it raises the stock (give_back in
-- lib/lifecycle.lua; src/soldout/).
--
-- Invariant: the pool leaves only after the lease: a buyer that began a join set the lease
-- first, so units it may be waiting for never reach open stock; released units go to this
-- shard's line first if one formed (give_back), then to open stock.
local unfit = state_unfit(ARGV[1])
if unfit then
  return {unfit == 'lost' and -1 or -3, 0}
end
local head = redis.call('HMGET', KEYS[1], 'stock', 'stale', 'seq', 'wl_pool', 'wl_until')
local pool = tonumber(head[4] or '0')
local now = redis_now()
if now < tonumber(head[5] or '0') then
  return {0, pool}
end
if pool <= 0 then
  return {1, 0}
end
redis.call('HSET', KEYS[1], 'wl_pool', 0)
local seq = give_back(pool, now, tonumber(head[3] or '0') + 1)
redis.call('HSET', KEYS[1], 'seq', seq)
return {1, pool}
