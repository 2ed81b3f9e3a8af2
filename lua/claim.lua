-- claim.lua: decide one or more claims on one SKU, in order, in one atomic step.
--
-- KEYS[1]        the SKU state hash {stock, limit, inflight, seq, stale}  <prefix>:{<sku>}:state
-- KEYS[2]        per-user unit counts (hash user -> units held)   <prefix>:{<sku>}:users
-- KEYS[3]        the winners' journal (stream, group "writers")   <prefix>:{<sku>}:journal
-- KEYS[4]        the claim records hash of the 10-minute bucket all these claim ids fall in
--                <prefix>:{<sku>}:claims:<bucket>, field = claim id
-- KEYS[5]        holds (hash claim id -> hold record)              <prefix>:{<sku>}:holds
-- KEYS[6]        hold expiries (sorted set claim id -> expires_ms)   <prefix>:{<sku>}:expiry
-- KEYS[7..]      the idempotency records, one for each claim that has a key, in claim order
--
-- ARGV[1]        now, unix milliseconds
-- ARGV[2]        idempotency record TTL in seconds (at least 24 h)
-- ARGV[3]        claim records TTL in seconds (they only settle uncertain outcomes)
-- ARGV[4]        floor: the highest state sequence the gateway knows PostgreSQL has recorded
-- ARGV[5]        n, the number of claims
-- per claim i, four values:
-- ARGV[6+4i]     claim id (UUIDv7, minted before the call)
-- ARGV[7+4i]     user id
-- ARGV[8+4i]     quantity (integer >= 1)
-- ARGV[9+4i]     Idempotency-Key value, or "" for none
--
-- Returns {"lost"} when the SKU state is missing (Redis lost it), {"stale"} when the state is
-- marked stale or its sequence is behind the floor (Redis came back with older data: the state
-- is marked stale here, so every gateway fails closed until restore). Nothing else is written
-- in either case. Otherwise a flat array of 1 + 2n values: first the expires_ms of this call's
-- winners when the SKU holds its claims (hold_ms > 0; 0 otherwise), then a (code, value) pair
-- per claim:
--   1, remaining     won
--   2, record        replay of an earlier win under the same key (the record below)
--   3, remaining     sold out (not enough stock; no partial fill)
--   4, held          per-user limit would be passed
--   5, 0             idempotency key reused with another request
--   6, 0             the claim id was fenced by resolve_claim.lua (checked only when it would
--                    have won)
--   7, opens_ms      the sale window has not opened (Redis's clock)
--   8, closes_ms     the sale window has closed
--
-- A winner's record, "claim_id|quantity|created_ms|remaining|seq|len(user)|user idem" (the
-- user id length-prefixed, the Idempotency-Key the rest), is built once and used twice: as its
-- idempotency record and as its journal entry (field c). `seq` is the state's sequence after
-- this winner: every change of the state bumps it, and the writer commits its high-water mark
-- to PostgreSQL, so a state that comes back behind that mark is known to be stale. A held
-- winner's record is prefixed "h|expires_ms|". The claim record, read back by resolve_claim.lua
-- and by GET /v1/claims/{id} before the writer has the claim, is
-- "remaining|quantity|len(user)|user".
--
-- The sale window (opens_ms, closes_ms) and the holds' expiry are decided on Redis's clock
-- (TIME), one clock for every gateway.
--
-- Invariant: stock never goes below 0 and a user's count never passes `limit`; every unit that
-- leaves stock is, in the same step, journaled (XADD) and counted in `inflight`, so a crash of
-- the gateway after this call loses no winner; a state older than what PostgreSQL recorded
-- never sells.
local state, users, journal = KEYS[1], KEYS[2], KEYS[3]
local head = redis.call('HMGET', state, 'stock', 'limit', 'seq', 'stale', 'hold_ms', 'opens_ms',
  'closes_ms')
if not head[1] then
  return {'lost'}
end
if head[4] then
  return {'stale'}
end
local seq = tonumber(head[3] or '0')
if seq < tonumber(ARGV[4]) then
  redis.call('HSET', state, 'stale', 'behind:' .. seq .. '<' .. ARGV[4])
  return {'stale'}
end
local now, ttl, records_ttl, n = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[5])
local stock, limit = tonumber(head[1]), tonumber(head[2])
local start_stock = stock
-- Counts of the users seen in this call: read once, written once at the end.
local held, changed = {}, {}
local records, holds, expiry = KEYS[4], KEYS[5], KEYS[6]
local next_idem = 7
local hold_ms = tonumber(head[5] or '0')
local window, window_at, expires = 0, 0, 0
if hold_ms > 0 or head[6] or head[7] then
  local t = redis.call('TIME')
  local rnow = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  if head[6] and rnow < tonumber(head[6]) then
    window, window_at = 7, tonumber(head[6])
  elseif head[7] and rnow >= tonumber(head[7]) then
    window, window_at = 8, tonumber(head[7])
  end
  if hold_ms > 0 then
    expires = rnow + hold_ms
  end
end
local out = {expires}
for i = 0, n - 1 do
  local id, user = ARGV[6 + 4 * i], ARGV[7 + 4 * i]
  local qty, idem = tonumber(ARGV[8 + 4 * i]), ARGV[9 + 4 * i]
  local idem_key, prior = nil, false
  if idem ~= '' then
    idem_key = KEYS[next_idem]
    next_idem = next_idem + 1
    prior = redis.call('GET', idem_key)
  end
  if prior then
    local pqty = string.match(prior, '^h|%d+|[^|]*|([^|]*)|') or string.match(prior, '^[^|]*|([^|]*)|')
    if tonumber(pqty) == qty then
      out[#out + 1] = 2
      out[#out + 1] = prior
    else
      out[#out + 1] = 5
      out[#out + 1] = 0
    end
  elseif window ~= 0 then
    out[#out + 1] = window
    out[#out + 1] = window_at
  else
    local h = held[user]
    if h == nil then
      h = tonumber(redis.call('HGET', users, user) or '0')
      held[user] = h
    end
    if h + qty > limit then
      out[#out + 1] = 4
      out[#out + 1] = h
    elseif qty > stock then
      out[#out + 1] = 3
      out[#out + 1] = stock
    else
      -- NX: a resolver that gave up on this id has fenced it ("void"); it must not win now.
      local claim_rec = (stock - qty) .. '|' .. qty .. '|' .. #user .. '|' .. user
      if redis.call('HSETNX', records, id, claim_rec) == 0 then
        out[#out + 1] = 6
        out[#out + 1] = 0
      else
        stock = stock - qty
        seq = seq + 1
        local record = id .. '|' .. qty .. '|' .. now .. '|' .. stock .. '|' .. seq .. '|'
          .. #user .. '|' .. user .. idem
        if expires > 0 then
          record = 'h|' .. expires .. '|' .. record
          redis.call('HSET', holds, id,
            'held|' .. qty .. '|' .. expires .. '|0|' .. #user .. '|' .. user)
          redis.call('ZADD', expiry, expires, id)
        end
        held[user] = h + qty
        changed[user] = true
        if idem_key then
          redis.call('SET', idem_key, record, 'EX', ttl)
        end
        redis.call('XADD', journal, '*', 'c', record)
        out[#out + 1] = 1
        out[#out + 1] = stock
      end
    end
  end
end
if stock ~= start_stock then
  redis.call('HSET', state, 'stock', stock, 'seq', seq)
  redis.call('HINCRBY', state, 'inflight', start_stock - stock)
  local counts = {}
  for user in pairs(changed) do
    counts[#counts + 1] = user
    counts[#counts + 1] = held[user]
  end
  redis.call('HSET', users, unpack(counts))
  redis.call('EXPIRE', records, records_ttl)
end
return out
