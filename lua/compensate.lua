-- compensate.lua: fence a parked claim for one reprocessor, or give its units back.
--
-- KEYS[1]  the SKU state hash <prefix>:{<sku>}:state
-- KEYS[2]  per-user unit counts <prefix>:{<sku>}:users
-- KEYS[3]  the claim's marker <prefix>:{<sku>}:comp:<claim_id>
-- KEYS[4]  the claim's idempotency record (the marker key again when the claim had none)
-- ARGV[1]  mode: "fence" (before an attempt) or "give" (after the last attempt failed)
-- ARGV[2]  the reprocessor's owner token
-- ARGV[3]  user id
-- ARGV[4]  units
-- ARGV[5]  claim id
-- ARGV[6]  marker TTL in seconds
--
-- Returns
--   fence: 1 when the marker now names this owner, 0 when the claim is already compensated.
--   give:  1 when the units were given back now, 0 when already compensated, -2 when another
--          owner fenced the claim since (this one's lease is stale: nothing changes), -1 when
--          the SKU state is missing or marked stale (nothing changes; compensate after a
--          restore).
--
-- Publishes KEYS[1] on <prefix>:units-back when it raises the stock (src/soldout.rs).
--
-- Invariant: a claim's units come back at most once, and only by the reprocessor that fenced
-- it last, so a stale lease holder can neither give back twice nor give back a claim that a
-- newer owner is writing.
local state, users, marker, idem = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local mode, token = ARGV[1], ARGV[2]
local current = redis.call('GET', marker)
if current == 'compensated' then
  return 0
end
if mode == 'fence' then
  redis.call('SET', marker, token, 'EX', tonumber(ARGV[6]))
  return 1
end
if current ~= token then
  return -2
end
local cur = redis.call('HMGET', state, 'stock', 'stale')
if not cur[1] or cur[2] then
  return -1
end
local user, units, id = ARGV[3], tonumber(ARGV[4]), ARGV[5]
redis.call('HINCRBY', state, 'stock', units)
redis.call('HINCRBY', state, 'seq', 1)
if redis.call('HINCRBY', users, user, -units) <= 0 then
  redis.call('HDEL', users, user)
end
if idem ~= marker then
  -- A retry under the same key must be decided afresh, not replay a claim that was undone.
  local record = redis.call('GET', idem)
  if record and string.sub(record, 1, #id) == id then
    redis.call('DEL', idem)
  end
end
redis.call('SET', marker, 'compensated', 'EX', tonumber(ARGV[6]))
-- Units may be back: every gateway's sold-out cache forgets this SKU (src/soldout.rs).
redis.call('PUBLISH', (string.gsub(KEYS[1], '{[^{]*$', 'units-back')), KEYS[1])
return 1
