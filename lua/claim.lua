-- claim.lua: decide one or more claims on one SKU, in order, in one atomic step.
--
-- KEYS[1]        the SKU state hash {stock, limit, inflight}      <prefix>:{<sku>}:state
-- KEYS[2]        per-user unit counts (hash user -> units held)   <prefix>:{<sku>}:users
-- KEYS[3]        the winners' journal (stream, group "writers")   <prefix>:{<sku>}:journal
-- per claim i (0-based), two keys:
-- KEYS[4+2i]     the claim record, keyed by the gateway-minted claim id
-- KEYS[5+2i]     the idempotency record (the claim key again when the request has none)
--
-- ARGV[1]        now, unix milliseconds
-- ARGV[2]        record TTL in seconds (claim and idempotency records)
-- ARGV[3]        n, the number of claims
-- per claim i, four values:
-- ARGV[4+4i]     claim id (UUIDv7, minted before the call)
-- ARGV[5+4i]     user id
-- ARGV[6+4i]     quantity (integer >= 1)
-- ARGV[7+4i]     Idempotency-Key value, or "" for none
--
-- Returns {"lost"} when the SKU state is missing (Redis lost it: the caller fails closed and
-- nothing is written). Otherwise an array of n results, each a flat array:
--   {1, remaining}                          won
--   {2, claim_id, quantity, remaining, ms}  replay of an earlier win under the same key
--   {3, remaining}                          sold out (not enough stock; no partial fill)
--   {4, held}                               per-user limit would be passed
--   {5}                                     idempotency key reused with another request
--   {6}                                     the claim id was fenced by resolve_claim.lua
--                                           (checked only when it would have won)
--
-- Invariant: stock never goes below 0 and a user's count never passes `limit`; every unit that
-- leaves stock is, in the same step, journaled (XADD) and counted in `inflight`, so a crash of
-- the gateway after this call loses no winner.
local state, users, journal = KEYS[1], KEYS[2], KEYS[3]
if redis.call('EXISTS', state) == 0 then
  return {'lost'}
end
local now, ttl, n = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local stock = tonumber(redis.call('HGET', state, 'stock'))
local limit = tonumber(redis.call('HGET', state, 'limit'))
local start_stock = stock
local out = {}
for i = 0, n - 1 do
  local claim_key, idem_key = KEYS[4 + 2 * i], KEYS[5 + 2 * i]
  local id, user = ARGV[4 + 4 * i], ARGV[5 + 4 * i]
  local qty, idem = tonumber(ARGV[6 + 4 * i]), ARGV[7 + 4 * i]
  local prior = false
  if idem ~= '' then
    prior = redis.call('GET', idem_key)
  end
  if prior then
    -- record: claim_id|quantity|remaining|created_ms
    local pid, pqty, prem, pms = string.match(prior, '^([^|]*)|([^|]*)|([^|]*)|([^|]*)$')
    if tonumber(pqty) == qty then
      out[i + 1] = {2, pid, tonumber(pqty), tonumber(prem), tonumber(pms)}
    else
      out[i + 1] = {5}
    end
  else
    local held = tonumber(redis.call('HGET', users, user) or '0')
    if held + qty > limit then
      out[i + 1] = {4, held}
    elseif qty > stock then
      out[i + 1] = {3, stock}
    else
      local record = id .. '|' .. qty .. '|' .. (stock - qty) .. '|' .. now
      -- NX: a resolver that gave up on this id has fenced it ("void"); it must not win now.
      if not redis.call('SET', claim_key, record, 'NX', 'EX', ttl) then
        out[i + 1] = {6}
      else
        stock = stock - qty
        redis.call('HINCRBY', users, user, qty)
        if idem ~= '' then
          redis.call('SET', idem_key, record, 'EX', ttl)
        end
        redis.call('XADD', journal, '*', 'id', id, 'user', user, 'qty', qty, 'idem', idem, 'ms', now,
          'rem', stock)
        out[i + 1] = {1, stock}
      end
    end
  end
end
if stock ~= start_stock then
  redis.call('HSET', state, 'stock', stock)
  redis.call('HINCRBY', state, 'inflight', start_stock - stock)
end
return out
