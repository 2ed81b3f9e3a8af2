-- compensate.lua: fence a parked claim for one reprocessor, or give its units back.
--
-- KEYS[1..9] the lifecycle keys of the SKU (see lib/lifecycle.lua; KEYS[9] the seat map)
-- KEYS[10] the claim's marker <prefix>:{<sku>}:comp:<claim_id>: the fencing reprocessor's
--          token, then "compensated" (units given back here) or "ended" (a hold that had ended)
-- KEYS[11] the SKU's idempotency records (hash)                   <prefix>:{<sku>}:idem
-- ARGV[1]  mode: "fence" (before an attempt) or "give" (after the last attempt failed)
-- ARGV[2]  the reprocessor's owner token
-- ARGV[3]  user id
-- ARGV[4]  units
-- ARGV[5]  claim id
-- ARGV[6]  marker TTL in seconds
-- ARGV[7]  floor ("give" only): the ledger's mark and incarnation (see lib/fresh.lua)
-- ARGV[8]  the claim's idempotency record's field in KEYS[11] (src/keys.rs
--          `idempotency_field`), "" or absent when the claim had no key
-- ARGV[9]  the claim's seats' bits in KEYS[9], comma-separated ("" or absent: no seats)
--
-- Returns
--   fence: 1 when the marker now names this owner, 0 when the claim is already compensated.
--   give:  1 when the units were given back now (to the waitlist's head first), 4 the same
--          for a hold that had been confirmed, 0 when already compensated, 3 (cancelled) or 5
--          (expired) when the claim was a hold that already ended so (its units came back
--          then; only the marker is set now), -2 when another owner fenced the claim since
--          (this one's lease is stale: nothing changes), -1 when the SKU state is missing or
--          stale or older than the floor (marked stale; nothing else changes: compensate
--          after a restore). The hold's status is
--          told because the reprocessor announces it before the compensation (its change may
--          not have reached the parked row yet).
--
-- Publishes KEYS[1] on <prefix>:units-back when it raises the stock (give_back in
-- lib/lifecycle.lua; src/soldout/).
--
-- Keeps I1 and I4 (docs/invariants.md): a seated claim's seats are freed in the same step as
-- its units (stock always equals the map's free seats), and only then.
-- Invariant: a claim's units come back at most once, and only by the reprocessor that fenced
-- it last, so a stale lease holder can neither give back twice nor give back a claim that a
-- newer owner is writing. A hold's units come back once whichever ends it: its expiry, a
-- cancel, or this compensation.
local state, users, marker, idems = KEYS[1], KEYS[2], KEYS[10], KEYS[11]
local mode, token = ARGV[1], ARGV[2]
local current = redis.call('GET', marker)
-- "compensated": this compensation gave the units back; "ended": the claim was a hold that had
-- ended already, its units back then (the SKU view tells the two apart: src/books.rs).
if current == 'compensated' or current == 'ended' then
  return 0
end
if mode == 'fence' then
  redis.call('SET', marker, token, 'EX', tonumber(ARGV[6]))
  return 1
end
if current ~= token then
  return -2
end
if state_unfit(ARGV[7]) then
  return -1
end
local user, units, id = ARGV[3], tonumber(ARGV[4]), ARGV[5]
local code = 1
local h = unpack_hold(redis.call('HGET', KEYS[4], id))
local now, seq = redis_now(), tonumber(redis.call('HGET', state, 'seq') or '0')
if h and h.status == 'cancelled' then
  code = 3
elseif h and h.status == 'expired' then
  code = 5
elseif h and h.status ~= 'compensated' then
  if h.status == 'confirmed' then
    code = 4
  end
  seq = end_hold(id, h, 'compensated', now, seq)
else
  if redis.call('HINCRBY', users, user, -units) <= 0 then
    redis.call('HDEL', users, user)
  end
  seq = give_back(units, now, bump(seq))
  -- Seated SKUs have no holds (refused at declare): their units come back only here.
  for bit in string.gmatch(ARGV[9] or '', '%d+') do
    redis.call('SETBIT', KEYS[9], tonumber(bit), 0)
  end
end
redis.call('HSET', state, 'seq', seq)
local field = ARGV[8] or ''
if field ~= '' then
  -- A retry under the same key must be decided afresh, not replay a claim that was undone.
  -- A held winner's record starts "h|expires_ms|" (claim.lua).
  local record = redis.call('HGET', idems, field)
  if record then
    local body = string.match(record, '^h|%d+|(.*)$') or record
    -- A seated claim's record: "fingerprint|claim_id|..." (claim_seats.lua).
    if string.sub(body, 1, #id) == id or string.match(record, '^[^|]*|([^|]*)|') == id then
      redis.call('HDEL', idems, field)
    end
  end
end
redis.call('SET', marker, (code == 3 or code == 5) and 'ended' or 'compensated', 'EX',
  tonumber(ARGV[6]))
return code
