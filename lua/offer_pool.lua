-- offer_pool.lua: offer units of a shard's waitlist pool to the head of that shard's line (the
-- feed of a sharded SKU's lines decides how many, by join ticket across every line:
-- src/shards/line.rs).
--
-- KEYS[1..9] the shard's lifecycle keys (see lib/lifecycle.lua)
-- ARGV[1]    the most units to offer
-- ARGV[2]    "1" to first move this shard's open stock into the pool: the feed saw somebody
--            waiting in one of the SKU's lines and has just renewed the line lease, so open
--            stock here is a unit that reached it without a lease (after a restore rebuilt
--            the state, or a lease that lapsed while every gateway was away) and belongs to
--            the lines, as give_back would have given it
-- ARGV[3]    floor: the ledger's mark and incarnation (see lib/fresh.lua)
--
-- Returns {offered, pool left}; {-1, 0} when the state is missing, {-3, 0} when it is marked
-- stale or older than the floor (marked stale here; nothing else changes in either case).
--
-- Keeps I1 and I3 (docs/invariants.md).
-- Invariant: a pooled unit leaves the pool only as an offer (a held claim on this shard,
-- counted in its buyer's per-user count here, so the per-user limit holds) or, when the
-- line runs out, stays in the pool; no unit is created or lost; the state's `seq` moves with
-- every change journaled.
local unfit = state_unfit(ARGV[3])
if unfit then
  return {unfit == 'lost' and -1 or -3, 0}
end
local head = redis.call('HMGET', KEYS[1], 'stock', 'stale', 'seq', 'wl_pool')
local pool, seq = tonumber(head[4] or '0'), tonumber(head[3] or '0')
local stock = tonumber(head[1])
if ARGV[2] == '1' and stock > 0 then
  pool, seq = pool + stock, seq + 1
  redis.call('HSET', KEYS[1], 'stock', 0, 'wl_pool', pool, 'seq', seq)
end
local n = math.min(pool, tonumber(ARGV[1]))
if n <= 0 then
  return {0, pool}
end
local left
left, seq = offer_line(n, redis_now(), seq + 1)
redis.call('HSET', KEYS[1], 'wl_pool', pool - n + left, 'seq', seq)
return {n - left, pool - n + left}
