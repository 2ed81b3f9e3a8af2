-- restock.lua: add a (possibly negative) delta to a SKU's remaining stock, once per operation.
--
-- KEYS[1..9] the lifecycle keys of the SKU (see lib/lifecycle.lua)
-- KEYS[10]  the operation's marker <prefix>:{<sku>}:restock:<op_id>
-- KEYS[11] the SKU's operator fence <prefix>:{<sku>}:op_fence: raised to ARGV[4] when the
--          state is missing (see below)
-- ARGV[1]  mode: "apply", or "resolve" (after an apply whose answer never came)
-- ARGV[2]  delta (integer)
-- ARGV[3]  marker TTL in seconds
-- ARGV[4]  the operator epoch this call runs under (see migrations/0004_operator_fences.sql)
-- ARGV[5]  floor (apply only): the ledger's mark and incarnation (see lib/fresh.lua): a state
--          older than it came back with older data and is marked stale instead of moved
--
-- Returns {code, remaining, seq}:
--   apply:   {1, remaining, seq} applied now; {2, remaining, seq} applied earlier (same op);
--            {0, remaining, seq} refused, the stock would go below 0 (nothing changes);
--            {-1, 0, 0} the SKU state is missing (Redis lost the SKU, or a restore closed it):
--                       the operator fence is raised to this epoch, so a restore that read
--                       the total before this restock cannot rebuild the state from it;
--            {-3, 0, 0} the state is marked stale, or is behind the floor and is marked stale
--                       now (fail closed until restore);
--            {-4, 0, 0} a newer operator action touched the state: this caller lost its lock
--                       (nothing changes; an operation already applied or fenced is reported
--                       as such whatever the epoch);
--            {3, 0, 0} fenced by resolve.
--   resolve: {2, remaining, seq} the operation was applied; {3, 0, 0} it was not, and now
--            cannot be.
-- `seq` is the state's sequence after the operation (the caller records it in PostgreSQL, so
-- a Redis that comes back without this restock is known to be stale).
--
-- Publishes KEYS[1] on <prefix>:units-back when it raises the stock (give_back in
-- lib/lifecycle.lua; src/soldout/).
--
-- Keeps I1, I4 and I5 (docs/invariants.md).
-- Invariant: remaining stock never goes below 0, and one operation moves it at most once: a
-- retried or late apply finds the marker, and resolve answers an uncertain apply by reading
-- (fencing it when absent) rather than by sending the delta again. An operator whose lock is
-- gone never moves a state a newer operator has touched, and no restock moves a state that
-- is behind the ledger. Units added go to the waitlist's head first (give_back): open stock
-- gets only what nobody waits for.
local state, marker = KEYS[1], KEYS[10]
local epoch = tonumber(ARGV[4])
local cur = redis.call('HMGET', state, 'stock', 'seq', 'stale', 'epoch', 'inc')
-- What already happened to this operation is reported to anyone, whatever their epoch: a
-- read-back must never call an applied restock "not applied".
local seen = redis.call('GET', marker)
if seen == 'void' then
  return {3, 0, 0}
end
if seen then
  return {2, tonumber(cur[1] or '0'), tonumber(seen)}
end
if ARGV[1] == 'resolve' then
  -- Fencing an operation that never ran is safe under any epoch: it only stops it from running.
  redis.call('SET', marker, 'void', 'EX', tonumber(ARGV[3]))
  return {3, 0, 0}
end
if not cur[1] then
  -- The caller counts the delta as applied (it is in the ledger's total, which the next
  -- restore reads). A restore under an older epoch read the total without it: if its last
  -- call is still on its way (its answer or its lock lost), it must find the fence and rebuild
  -- nothing, or the stock would be short of this delta for good.
  local fence = tonumber(redis.call('GET', KEYS[11]) or '0')
  if epoch > fence then
    redis.call('SET', KEYS[11], epoch)
  end
  return {-1, 0, 0}
end
if tonumber(cur[4] or '0') > epoch then
  return {-4, 0, 0}
end
redis.call('HSET', state, 'epoch', epoch)
if cur[3] then
  return {-3, 0, 0}
end
local stock, seq = tonumber(cur[1]), tonumber(cur[2] or '0')
-- A negative delta checked against a stock that forgot sales would shrink the total below
-- what is sold.
if close_if_behind(cur[2], cur[5], ARGV[5]) then
  return {-3, 0, 0}
end
local after = stock + tonumber(ARGV[2])
if after < 0 then
  return {0, stock, seq}
end
seq = seq + 1
local delta = tonumber(ARGV[2])
if delta > 0 then
  seq = give_back(delta, redis_now(), seq)
  after = tonumber(redis.call('HGET', state, 'stock'))
else
  redis.call('HSET', state, 'stock', after)
end
redis.call('HSET', state, 'seq', seq)
-- The marker holds the sequence this operation produced, so a read-back can report it.
redis.call('SET', marker, seq, 'EX', tonumber(ARGV[3]))
return {1, after, seq}
