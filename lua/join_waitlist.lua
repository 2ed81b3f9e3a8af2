-- join_waitlist.lua: put a buyer at the end of a sold-out SKU's waitlist, once.
--
-- KEYS[1..9] the lifecycle keys of the SKU (see lib/lifecycle.lua)
-- ARGV[1]    the new entry's id (minted by the gateway; an offer made to it uses it as claim id)
-- ARGV[2]    user id
-- ARGV[3]    "1" when another shard of the SKU holds units or a transfer between shards is in
--            flight (checked by the gateway just before; "0" on a SKU of one shard): units
--            remain, as when this shard's stock is above 0; "0" otherwise
-- ARGV[4]    on a sharded SKU, the join ticket the gateway took from shard 0 (line_lease.lua):
--            the entry's join order, comparable across the SKU's lines; "" on a SKU of one
--            shard (the order is this line's next)
-- ARGV[5]    floor: the ledger's mark and incarnation (see lib/fresh.lua)
-- ARGV[6]    the units the entry waits for (optional, 1): a seated SKU's entry is offered the
--            best seats for it (lib/lifecycle.lua offer_seats)
--
-- Returns {code, entry_id, position}:
--   1  joined now: the new entry and its place in line (1 = next to be offered)
--   2  the user already has an entry that is waiting or offered: that entry and its place
--      (0 when offered)
--   3  units remain (at least the entry's quantity): buy them instead (nothing changes)
--   4  the user's units and the entry's quantity would pass its per-user limit (nothing
--      changes)
--   5  the sale window has not opened, 6 it has closed (nothing changes)
--  -1  the SKU state is missing, -3 stale or older than the floor (fail closed)
--
-- Keeps I3 and I4 (docs/invariants.md).
-- Invariant: one live entry per user and SKU, in join order; an entry is taken only while the
-- stock is 0 (units that come back go to the line before open stock, see give_back). On a
-- sharded SKU this script runs on the joiner's own shard, whose line it joins in ticket order,
-- after the gateway leased every shard and found every other shard dry with nothing in transit
-- (not atomically with this check; the lease keeps units given back meanwhile out of open
-- stock: see src/shards/line.rs); the per-user count it checks is the one every claim of the
-- user moves, and the offers made here are counted in it too.
local eid, user = ARGV[1], ARGV[2]
local qty = tonumber(ARGV[6] or '1') or 1
local unfit = state_unfit(ARGV[5])
if unfit then
  return {unfit == 'lost' and -1 or -3, '', 0}
end
local head = redis.call('HMGET', KEYS[1], 'stock', 'limit', 'seq', 'stale', 'opens_ms',
  'closes_ms')
local mine = redis.call('HGET', KEYS[8], user)
if mine then
  local e = unpack_entry(redis.call('HGET', KEYS[7], mine))
  if e and e.status == 'waiting' then
    return {2, mine, (redis.call('ZRANK', KEYS[6], mine) or 0) + 1}
  end
  if e and e.status == 'offered' then
    return {2, mine, 0}
  end
end
local now = redis_now()
if head[5] and now < tonumber(head[5]) then
  return {5, '', 0}
end
if head[6] and now >= tonumber(head[6]) then
  return {6, '', 0}
end
if tonumber(head[1]) >= qty or ARGV[3] == '1' then
  return {3, '', 0}
end
if tonumber(redis.call('HGET', KEYS[2], user) or '0') + qty > tonumber(head[2]) then
  return {4, '', 0}
end
local order = tonumber(ARGV[4] or '')
if not order then
  order = redis.call('HINCRBY', KEYS[1], 'wl_order', 1)
end
local e = { order = order, ms = now, user = user, qty = qty }
redis.call('ZADD', KEYS[6], order, eid)
redis.call('HSET', KEYS[7], eid, pack_entry('waiting', order, now, user, qty))
redis.call('HSET', KEYS[8], user, eid)
local seq = bump(tonumber(head[3]))
redis.call('XADD', KEYS[3], '*', 'w', entry_record(eid, e, 'waiting', now, seq))
redis.call('HSET', KEYS[1], 'seq', seq)
return {1, eid, redis.call('ZRANK', KEYS[6], eid) + 1}
