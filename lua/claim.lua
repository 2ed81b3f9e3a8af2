-- claim.lua: decide the claims of one call on one SKU, in order, in one atomic step.
--
-- KEYS[1]        the SKU state hash {stock, limit, inflight, seq, stale}  <prefix>:{<sku>}:state
-- KEYS[2]        per-user unit counts (hash user -> units held)   <prefix>:{<sku>}:users
-- KEYS[3]        the winners' journal (stream, group "writers")   <prefix>:{<sku>}:journal
-- KEYS[4]        the call records hash of the 10-minute bucket the call id falls in
--                <prefix>:{<sku>}:claims:<bucket>, field = call id
-- KEYS[5]        holds (hash claim id -> hold record)              <prefix>:{<sku>}:holds
-- KEYS[6]        hold expiries (sorted set claim id -> expires_ms)   <prefix>:{<sku>}:expiry
-- KEYS[7]        the idempotency records (hash field -> record)    <prefix>:{<sku>}:idem
--
-- ARGV[1]        now, unix milliseconds
-- ARGV[2]        the idempotency records' fields of the claims that have a key, in claim order,
--                16 bytes each (src/keys.rs `idempotency_field`: a digest of user and key)
-- ARGV[3]        call records TTL in seconds (they only settle uncertain outcomes)
-- ARGV[4]        floor: "seq:inc", the highest state sequence and incarnation the gateway knows
--                PostgreSQL has recorded (lib/fresh.lua, prepended; "seq" alone: incarnation 0)
-- ARGV[5]        the call id (UUIDv7 text, minted when the call was formed; src/ids.rs)
-- ARGV[6]        n, the number of claims (1..128)
-- per claim i (0-based), four values:
-- ARGV[7+4i]     user id
-- ARGV[8+4i]     quantity (integer >= 1)
-- ARGV[9+4i]     Idempotency-Key value, or "" for none
-- ARGV[10+4i]    the claim's piece, "i|quantity|len(user)|user", spelled out by the caller so
--                that a winner costs no string building here
--
-- Claim i's id is the call id with i in the low 7 bits of its byte 11 (hex digits 27-28 of
-- the text; the call id's own index is 0), as src/ids.rs `claim_in` makes it.
--
-- Returns {"fenced"} when the call id already has a record: resolve_claim.lua fenced the call
-- after its answer was lost, or this very call ran before (a resend); nothing is decided or
-- written, and the caller reads the outcomes back. {"lost"} when the SKU state is missing
-- (Redis lost it), {"stale"} when the state is marked stale or is older than the floor
-- (its sequence behind the mark, or its incarnation older: Redis came back with older data: the state is marked stale here, so every gateway
-- fails closed until restore); nothing else is written in either case. Otherwise a flat array
-- of 1 + 2n values: first the expires_ms of this call's winners when the SKU holds its claims
-- (hold_ms > 0; 0 otherwise), then a (code, value) pair per claim:
--   1, remaining     won
--   2, record        replay of an earlier win under the same key (the record below)
--   3, remaining     sold out (not enough stock; no partial fill)
--   4, held          per-user limit would be passed
--   5, 0             idempotency key reused with another request
--   7, opens_ms      the sale window has not opened (Redis's clock)
--   8, closes_ms     the sale window has closed
--
-- Per call, not per winner, when anyone won:
-- - one journal entry: XADD journal * k <call id> t <now> q <seq before> r <stock before>
--   [x <expires_ms>] c <piece idem> c <piece idem> ... (the winners in claim order; the writer
--   derives each winner's claim id, its stock left (r less the quantities up to it) and its
--   sequence (q plus its place among the winners): every change of the state bumps `seq`, and
--   the writer commits its high-water mark to PostgreSQL, so a state that comes back behind
--   that mark is known to be stale);
-- - one call record, the field <call id> of KEYS[4]: "<stock before>|" (on a SKU that holds
--   its claims "<stock before>:<expires_ms>|", so a read-back answers a win as the hold it
--   is) and the winners' pieces, read back by resolve_claim.lua and by GET /v1/claims/{id}
--   before the writer has the claim. A claim of the call that is not in it did not win and
--   moved nothing.
-- Per keyed winner, its idempotency record "claim_id|quantity|remaining" (src/record.rs
-- `IdemRecord`; a held winner's is prefixed "h|expires_ms|"), a field of KEYS[7] with no expiry
-- of its own: only winners are recorded, so the hash grows by at most one field per unit sold;
-- per held winner, its hold record and expiry.
--
-- The sale window (opens_ms, closes_ms) and the holds' expiry are decided on Redis's clock
-- (TIME), one clock for every gateway.
--
-- Keeps I1, I2, I3 and I4 (docs/invariants.md).
-- Invariant: stock never goes below 0 and a user's count never passes `limit`; every unit that
-- leaves stock is, in the same step, journaled (XADD) and counted in `inflight`, so a crash of
-- the gateway after this call loses no winner; a call id decides at most once, and never
-- after a resolver fenced it; a state older than what PostgreSQL recorded never sells.
local state, users, journal, records = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local call = ARGV[5]
-- First: a resend of a call that ran must not run again, whatever became of the state since.
if redis.call('HEXISTS', records, call) == 1 then
  return {'fenced'}
end
local head = redis.call('HMGET', state, 'stock', 'limit', 'seq', 'stale', 'hold_ms', 'opens_ms',
  'closes_ms', 'inflight', 'inc')
if not head[1] then
  return {'lost'}
end
if head[4] then
  return {'stale'}
end
-- The check of lib/fresh.lua on the fields read above: no extra call on the hot path.
if close_if_behind(head[3], head[9], ARGV[4]) then
  return {'stale'}
end
local seq = tonumber(head[3] or '0')
local now, fields, records_ttl, n = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[6])
local stock, limit = tonumber(head[1]), tonumber(head[2])
local holds, expiry, idems = KEYS[5], KEYS[6], KEYS[7]
local next_field = 1
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
-- The counts of every user of the call, in one read; written once at the end.
local held, changed = {}, {}
if window == 0 then
  local names = {}
  for i = 0, n - 1 do
    names[i + 1] = ARGV[7 + 4 * i]
  end
  local counts = redis.call('HMGET', users, unpack(names))
  for i = 1, n do
    held[names[i]] = tonumber(counts[i] or '0')
  end
end
local out = {expires}
local entry = {'k', call, 't', now, 'q', seq, 'r', stock}
if expires > 0 then
  entry[#entry + 1] = 'x'
  entry[#entry + 1] = expires
end
-- %d: a stock of 10^14 or more would otherwise be written as 1e+14.
local head_piece = string.format('%d', stock)
if expires > 0 then
  head_piece = head_piece .. ':' .. string.format('%d', expires)
end
local pieces, hold_recs, hold_exp = {head_piece .. '|'}, {}, {}
local id_head, id_byte, id_tail
for i = 0, n - 1 do
  local user = ARGV[7 + 4 * i]
  local qty, idem = tonumber(ARGV[8 + 4 * i]), ARGV[9 + 4 * i]
  local idem_key, prior = nil, false
  if idem ~= '' then
    idem_key = string.sub(fields, next_field, next_field + 15)
    next_field = next_field + 16
    prior = redis.call('HGET', idems, idem_key)
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
    if h + qty > limit then
      out[#out + 1] = 4
      out[#out + 1] = h
    elseif qty > stock then
      out[#out + 1] = 3
      out[#out + 1] = stock
    else
      local piece = ARGV[10 + 4 * i]
      stock = stock - qty
      seq = seq + 1
      if idem_key or expires > 0 then
        -- Only a keyed or held winner needs its claim id spelled out here.
        if not id_head then
          id_head, id_byte, id_tail = string.sub(call, 1, 26),
            tonumber(string.sub(call, 27, 28), 16), string.sub(call, 29)
        end
        local id = id_head .. string.format('%02x', id_byte + i) .. id_tail
        if idem_key then
          local record = id .. '|' .. qty .. '|' .. string.format('%d', stock)
          if expires > 0 then
            record = 'h|' .. expires .. '|' .. record
          end
          -- At once, not with the counts at the end: a later claim of this call under the
          -- same key must find it and replay.
          redis.call('HSET', idems, idem_key, record)
        end
        if expires > 0 then
          hold_recs[#hold_recs + 1] = id
          hold_recs[#hold_recs + 1] = 'held|' .. qty .. '|' .. expires .. '|0|' .. #user .. '|'
            .. user
          hold_exp[#hold_exp + 1] = expires
          hold_exp[#hold_exp + 1] = id
        end
      end
      held[user] = h + qty
      changed[user] = true
      entry[#entry + 1] = 'c'
      entry[#entry + 1] = piece .. idem
      pieces[#pieces + 1] = piece
      out[#out + 1] = 1
      out[#out + 1] = stock
    end
  end
end
if #pieces > 1 then
  redis.call('HSET', state, 'stock', stock, 'seq', seq,
    'inflight', tonumber(head[8] or '0') + entry[8] - stock)
  local counts = {}
  for user in pairs(changed) do
    counts[#counts + 1] = user
    counts[#counts + 1] = held[user]
  end
  redis.call('HSET', users, unpack(counts))
  redis.call('XADD', journal, '*', unpack(entry))
  redis.call('HSET', records, call, table.concat(pieces))
  redis.call('EXPIRE', records, records_ttl)
  if #hold_recs > 0 then
    redis.call('HSET', holds, unpack(hold_recs))
    redis.call('ZADD', expiry, unpack(hold_exp))
  end
end
return out
