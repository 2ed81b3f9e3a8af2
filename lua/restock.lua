-- restock.lua: add a (possibly negative) delta to a SKU's remaining stock, once per operation.
--
-- KEYS[1]  the SKU state hash <prefix>:{<sku>}:state
-- KEYS[2]  the operation's marker <prefix>:{<sku>}:restock:<op_id>
-- ARGV[1]  mode: "apply", or "resolve" (after an apply whose answer never came)
-- ARGV[2]  delta (integer)
-- ARGV[3]  marker TTL in seconds
--
-- Returns
--   apply:   {1, remaining} applied now; {2, remaining} applied earlier (same op id);
--            {0, remaining} refused, the stock would go below 0 (nothing changes);
--            {-1, 0} the SKU state is missing (Redis lost the SKU); {3, 0} fenced by resolve.
--   resolve: {2, remaining} the operation was applied; {3, 0} it was not, and now cannot be.
--
-- Invariant: remaining stock never goes below 0, and one operation moves it at most once: a
-- retried or late apply finds the marker, and resolve answers an uncertain apply by reading
-- (fencing it when absent) rather than by sending the delta again.
local state, marker = KEYS[1], KEYS[2]
local seen = redis.call('GET', marker)
if seen == 'void' then
  return {3, 0}
end
if seen then
  return {2, tonumber(redis.call('HGET', state, 'stock') or '0')}
end
if ARGV[1] == 'resolve' then
  redis.call('SET', marker, 'void', 'EX', tonumber(ARGV[3]))
  return {3, 0}
end
if redis.call('EXISTS', state) == 0 then
  return {-1, 0}
end
local stock = tonumber(redis.call('HGET', state, 'stock'))
local after = stock + tonumber(ARGV[2])
if after < 0 then
  return {0, stock}
end
redis.call('HSET', state, 'stock', after)
redis.call('SET', marker, 'applied', 'EX', tonumber(ARGV[3]))
return {1, after}
