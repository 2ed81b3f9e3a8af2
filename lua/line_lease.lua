-- line_lease.lua: put one shard of a sharded SKU under a line lease before a buyer joins one
-- of the SKU's lines (or while the feed sees somebody waiting), and read what the join needs.
--
-- KEYS[1]  the shard's state hash                 <prefix>:{<sku>[#i]}:state
-- KEYS[2]  the shard's transfers not yet done     <prefix>:{<sku>[#i]}:xfer:out
-- ARGV[1]  the lease's length, milliseconds: it lasts until Redis's now + this, or longer if
--          it already did
-- ARGV[2]  "1" to also take a join ticket (shard 0 only): the SKU's next join order, from the
--          state's `wl_order` (restore sets it above every order the ledger holds)
-- ARGV[3]  floor: the ledger's mark and incarnation (see lib/fresh.lua, prepended)
--
-- Returns {1, stock, pending transfers, ticket} (ticket 0 when none was asked for);
-- {-1, 0, 0, 0} when the state is missing, {-3, 0, 0, 0} when it is marked stale or older than
-- the floor (nothing else changes in either case).
--
-- Invariant: while the lease lasts, every unit given back on this shard goes to its pool
-- (lib/lifecycle.lua's give_back), where only the SKU's lines are offered it, in ticket
-- order (src/shards/line.rs). The lease is set on every shard BEFORE the joiner checks that
-- every shard is dry, so no unit can reach open stock between that check and the join. The
-- lease only ever grows here; it never creates a state that is missing.
local state = KEYS[1]
local unfit = state_unfit(ARGV[3])
if unfit then
  return {unfit == 'lost' and -1 or -3, 0, 0, 0}
end
local head = redis.call('HMGET', state, 'stock', 'stale', 'wl_until')
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local untl = now + tonumber(ARGV[1])
if untl > tonumber(head[3] or '0') then
  redis.call('HSET', state, 'wl_until', untl)
end
local ticket = 0
if ARGV[2] == '1' then
  ticket = redis.call('HINCRBY', state, 'wl_order', 1)
end
return {1, tonumber(head[1]), redis.call('HLEN', KEYS[2]), ticket}
