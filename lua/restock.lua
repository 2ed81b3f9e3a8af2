-- restock.lua: add a (possibly negative) delta to a SKU's remaining stock.
--
-- KEYS[1]  the SKU state hash <prefix>:{<sku>}:state
-- ARGV[1]  delta (integer)
--
-- Returns {1, remaining} when applied, {0, remaining} when the stock would go below 0 (nothing
-- changes), {-1, 0} when the state is missing (Redis lost the SKU).
--
-- Invariant: remaining stock never goes below 0.
local state = KEYS[1]
if redis.call('EXISTS', state) == 0 then
  return {-1, 0}
end
local stock = tonumber(redis.call('HGET', state, 'stock'))
local after = stock + tonumber(ARGV[1])
if after < 0 then
  return {0, stock}
end
redis.call('HSET', state, 'stock', after)
return {1, after}
