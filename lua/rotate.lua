-- rotate.lua: advance a fresh state's incarnation, so that every older copy of it (a snapshot
-- taken before now) is recognised as older whatever its own moves later make of its sequence.
--
-- KEYS[1]  the SKU state hash <prefix>:{<sku>}:state
-- ARGV[1]  floor: "seq:inc", the ledger's mark and recorded incarnation (see lib/fresh.lua)
-- ARGV[2]  the incarnation the caller read from the state ("0" when it had none)
--
-- Returns {1, inc} when the state now carries the new incarnation `inc` (the caller records it
-- in PostgreSQL once the replicas hold it); {0, inc} when the state's incarnation is no longer
-- the one read (another gateway rotated it: nothing changes); {-1, 0} when the state is
-- missing, {-3, 0} when it is stale or older than the floor (marked stale here).
--
-- Invariant: an incarnation only grows, and is a Redis-clock time at least one above the
-- last: a restore (which stamps Redis's now) is above every incarnation a rotation of the
-- state it replaced could still record. Neither the stock nor `seq` moves here.
local unfit = state_unfit(ARGV[1])
if unfit == 'lost' then
  return {-1, 0}
end
if unfit then
  return {-3, 0}
end
local inc = tonumber(redis.call('HGET', KEYS[1], 'inc') or '0')
if inc ~= tonumber(ARGV[2]) then
  return {0, inc}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local new = math.max(inc + 1, now)
redis.call('HSET', KEYS[1], 'inc', new)
return {1, new}
