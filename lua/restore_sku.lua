-- restore_sku.lua: rebuild a SKU's state from the ledger after Redis lost it.
--
-- KEYS[1]  the SKU state hash <prefix>:{<sku>}:state
-- KEYS[2]  per-user unit counts <prefix>:{<sku>}:users
-- KEYS[3]  the winners' journal <prefix>:{<sku>}:journal
-- ARGV[1]  "1" to replace a state that is present (force), else "0"
-- ARGV[2]  stock according to the ledger: total - live claims (written or pending)
-- ARGV[3]  per-user limit
-- ARGV[2k+2], ARGV[2k+3] for k >= 1: a user id and the units the ledger says they hold
--
-- Returns {1, stock, inflight} when restored, {0, 0, 0} when a state is present and force is
-- off (nothing changes).
--
-- Invariant: winners still in the journal (decided, not yet written) are neither re-sold nor
-- forgotten: their units are taken off the stock, added to their users and counted in
-- `inflight`, exactly as claim.lua left them.
local state, users, journal = KEYS[1], KEYS[2], KEYS[3]
if redis.call('EXISTS', state) == 1 and ARGV[1] ~= '1' then
  return {0, 0, 0}
end
local stock = tonumber(ARGV[2])
redis.call('DEL', users)
for i = 4, #ARGV, 2 do
  redis.call('HSET', users, ARGV[i], ARGV[i + 1])
end
local inflight = 0
if redis.call('EXISTS', journal) == 1 then
  for _, entry in ipairs(redis.call('XRANGE', journal, '-', '+')) do
    local f = entry[2]
    local user, qty = nil, 0
    for j = 1, #f, 2 do
      if f[j] == 'user' then user = f[j + 1] end
      if f[j] == 'qty' then qty = tonumber(f[j + 1]) end
    end
    inflight = inflight + qty
    redis.call('HINCRBY', users, user, qty)
  end
end
stock = stock - inflight
redis.call('DEL', state)
redis.call('HSET', state, 'stock', stock, 'limit', ARGV[3], 'inflight', inflight)
pcall(redis.call, 'XGROUP', 'CREATE', journal, 'writers', '0', 'MKSTREAM')
return {1, stock, inflight}
