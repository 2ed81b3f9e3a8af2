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
-- ARGV[7]        the plan: n bytes, byte i the place (0-based) of claim i's buyer among the
--                buyers below, plus 128 when the claim has an Idempotency-Key
-- ARGV[8]        the quantities: "" when every claim is of one unit, else n integers >= 1
--                joined by ","
-- ARGV[9]        the record's winners when every claim wins: every claim's piece, in order
-- ARGV[10]       u, the number of distinct buyers
-- ARGV[11..10+u] the buyers (user ids), each once, in the order of their first claim
-- ARGV[11+u+i]   claim i's piece (i 0-based), "i|quantity|len(user)|user"
-- ARGV[11+u+n..] the Idempotency-Key values of the claims that have one, in claim order
-- The caller (src/scripts/claim/args.rs) spells out every string a winner leaves behind, so
-- that a claim costs one argument here and the common call, where every claim wins, no string
-- building, number formatting or per-claim reply at all.
--
-- Claim i's id is the call id with i in the low 7 bits of its byte 11 (hex digits 27-28 of
-- the text; the call id's own index is 0), as src/ids.rs `claim_in` makes it.
--
-- Returns {"fenced"} when the call id already has a record: resolve_claim.lua fenced the call
-- after its answer was lost, or this very call ran before (a resend); nothing is decided or
-- written, and the caller reads the outcomes back. {"lost"} when the SKU state is missing
-- (Redis lost it), {"stale"} when the state is marked stale or is older than the floor
-- (its sequence behind the mark, or its incarnation older: Redis came back with older data:
-- the state is marked stale here, so every gateway fails closed until restore); nothing else
-- is written in either case. {expires_ms, stock} when every claim won: the expires_ms of this
-- call's winners when the SKU holds its claims (hold_ms > 0; 0 otherwise) and the stock
-- before the first; claim i's remaining stock is that less the quantities of claims 0..=i.
-- Otherwise a flat array of 1 + 2n values: first the expires_ms, then a (code, value) pair
-- per claim:
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
-- after a resolver fenced it; a state older than what PostgreSQL recorded never sells. The
-- call where every claim wins is decided at once (its quantities against the stock, each
-- buyer's against the limit, no key seen before); any other is decided claim by claim, and
-- both give what deciding claim by claim gives.
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
-- Numbers by arithmetic on the strings Redis gave (`+ 0`): a third of `tonumber`'s cost.
local n, u, fields = ARGV[6] + 0, ARGV[10] + 0, ARGV[2]
local stock0, limit = head[1] + 0, head[2] + 0
local holds, expiry, idems = KEYS[5], KEYS[6], KEYS[7]
local hold_ms = (head[5] or 0) + 0
local window, window_at, expires, expires_s = 0, 0, 0, nil
if hold_ms > 0 or head[6] or head[7] then
  local t = redis.call('TIME')
  local rnow = t[1] * 1000 + math.floor(t[2] / 1000)
  if head[6] and rnow < head[6] + 0 then
    window, window_at = 7, head[6] + 0
  elseif head[7] and rnow >= head[7] + 0 then
    window, window_at = 8, head[7] + 0
  end
  if hold_ms > 0 then
    expires = rnow + hold_ms
    -- %d: a time of 10^14 or more would otherwise be written as 1e+14.
    expires_s = string.format('%d', expires)
  end
end
local plan = {string.byte(ARGV[7], 1, n)}
local qty = nil
if ARGV[8] ~= '' then
  qty = {}
  for q in string.gmatch(ARGV[8], '%d+') do
    qty[#qty + 1] = q + 0
  end
end
local pieces, keys = 10 + u, 10 + u + n
-- Every keyed claim's earlier record, in one read (a key used twice in this call: below).
local keyed = #fields / 16
local names, priors = {}, {}
if keyed > 0 then
  for j = 1, keyed do
    names[j] = string.sub(fields, 16 * j - 15, 16 * j)
  end
  priors = redis.call('HMGET', idems, unpack(names))
end
-- The counts of every buyer of the call, in one read; written once at the end.
local counts = {}
if window == 0 then
  counts = redis.call('HMGET', users, unpack(ARGV, 11, 10 + u))
end

-- Does every claim win? Then each buyer's count after the call is `after`.
local fast, after, total = window == 0, {}, 0
if fast then
  local seen = {}
  for j = 1, keyed do
    if priors[j] or seen[names[j]] then
      fast = false
      break
    end
    seen[names[j]] = true
  end
end
if fast then
  for k = 1, u do
    after[k] = (counts[k] or 0) + 0
  end
  for i = 1, n do
    local k, q = plan[i] % 128 + 1, qty and qty[i] or 1
    after[k] = after[k] + q
    total = total + q
  end
  fast = total <= stock0
  for k = 1, u do
    if after[k] > limit then
      fast = false
      break
    end
  end
end

-- What a winner leaves besides its journal piece: the records only a keyed or held winner
-- has, which need its claim id spelled out.
local idem_recs, hold_recs, hold_exp = {}, {}, {}
local id_head, id_byte, id_tail
local function extras(i, q, left, field, k)
  if not id_head then
    id_head, id_byte, id_tail = string.sub(call, 1, 26),
      tonumber(string.sub(call, 27, 28), 16), string.sub(call, 29)
  end
  local id = id_head .. string.format('%02x', id_byte + i - 1) .. id_tail
  if field then
    local record = string.format('%s|%d|%d', id, q, left)
    if expires > 0 then
      record = 'h|' .. expires_s .. '|' .. record
    end
    idem_recs[#idem_recs + 1] = field
    idem_recs[#idem_recs + 1] = record
  end
  if expires > 0 then
    local user = ARGV[10 + k]
    hold_recs[#hold_recs + 1] = id
    hold_recs[#hold_recs + 1] = string.format('held|%d|%s|0|%d|%s', q, expires_s, #user, user)
    hold_exp[#hold_exp + 1] = expires
    hold_exp[#hold_exp + 1] = id
  end
  return field and idem_recs[#idem_recs]
end

local entry = {'k', call, 't', ARGV[1], 'q', head[3] or '0', 'r', head[1]}
local head_piece = head[1]
if expires > 0 then
  entry[9], entry[10] = 'x', expires_s
  head_piece = head_piece .. ':' .. expires_s
end
local e, won, record = #entry, 0, nil
local out = {expires}
local stock = stock0
local changed = {}
if fast then
  won, stock = n, stock0 - total
  local j, left, more = 0, stock0, keyed > 0 or expires > 0
  for i = 1, n do
    local c, field = ARGV[pieces + i], nil
    if plan[i] >= 128 then
      j = j + 1
      field = names[j]
      c = c .. ARGV[keys + j]
    end
    entry[e + 1], entry[e + 2], e = 'c', c, e + 2
    if more then
      local q = qty and qty[i] or 1
      left = left - q
      extras(i, q, left, field, plan[i] % 128 + 1)
    end
  end
  record = head_piece .. '|' .. ARGV[9]
  for k = 1, u do
    changed[k] = after[k]
  end
  out[2] = stock0
else
  -- Claim by claim, in order, as one claim at a time would be decided.
  local held, written, winners, j = {}, {}, {}, 0
  for i = 1, n do
    local b = plan[i]
    local k, q = b % 128 + 1, qty and qty[i] or 1
    local field, prior = nil, false
    if b >= 128 then
      j = j + 1
      field = names[j]
      -- A later claim of this call under the same key finds the earlier one's record.
      prior = written[field] or priors[j]
    end
    local at = 2 * i
    if prior then
      local pqty = string.match(prior, '^h|%d+|[^|]*|([^|]*)|') or string.match(prior, '^[^|]*|([^|]*)|')
      if tonumber(pqty) == q then
        out[at], out[at + 1] = 2, prior
      else
        out[at], out[at + 1] = 5, 0
      end
    elseif window ~= 0 then
      out[at], out[at + 1] = window, window_at
    else
      local h = held[k] or (counts[k] or 0) + 0
      held[k] = h
      if h + q > limit then
        out[at], out[at + 1] = 4, h
      elseif q > stock then
        out[at], out[at + 1] = 3, stock
      else
        stock = stock - q
        held[k] = h + q
        changed[k] = h + q
        won = won + 1
        local piece = ARGV[pieces + i]
        winners[won] = piece
        entry[e + 1], entry[e + 2], e = 'c', field and piece .. ARGV[keys + j] or piece, e + 2
        if field or expires > 0 then
          local rec = extras(i, q, stock, field, k)
          if field then
            written[field] = rec
          end
        end
        out[at], out[at + 1] = 1, stock
      end
    end
  end
  record = head_piece .. '|' .. table.concat(winners)
end
if won > 0 then
  redis.call('HSET', state, 'stock', stock, 'seq', (head[3] or 0) + won,
    'inflight', (head[8] or 0) + (head[1] - stock))
  local cs = {}
  for k, c in pairs(changed) do
    cs[#cs + 1] = ARGV[10 + k]
    cs[#cs + 1] = c
  end
  redis.call('HSET', users, unpack(cs))
  redis.call('XADD', journal, '*', unpack(entry))
  redis.call('HSET', records, call, record)
  redis.call('EXPIRE', records, ARGV[3])
  if #idem_recs > 0 then
    redis.call('HSET', idems, unpack(idem_recs))
  end
  if #hold_recs > 0 then
    redis.call('HSET', holds, unpack(hold_recs))
    redis.call('ZADD', expiry, unpack(hold_exp))
  end
end
return out
