-- decide_hold.lua: confirm or cancel one held claim, decided against Redis's clock.
--
-- KEYS[1..9] the lifecycle keys of the claim's SKU (see lib/lifecycle.lua)
-- ARGV[1]    "confirm" or "cancel"
-- ARGV[2]    the claim id
-- ARGV[3]    the caller's user id, or "" for the admin (who may act on any claim)
-- ARGV[4]    floor: the ledger's mark and incarnation (see lib/fresh.lua)
--
-- Returns {code, status, expires_ms}:
--   0  Redis holds no hold of this id for this caller (not a hold, not the caller's, or its
--      record was dropped after its final status was written: the caller reads PostgreSQL)
--   1  done: the hold is now `status` (confirmed or cancelled), now or by an earlier call
--   2  refused: the hold is already `status` (cancelled, expired, confirmed, compensated)
--  -1  the SKU state is missing (nothing changes; fail closed)
--  -3  the state is stale or older than the floor (marked stale; nothing else changes)
--
-- Keeps I1 and I4 (docs/invariants.md).
-- Invariant: a hold ends once. Confirm and cancel and the expiry (expire_holds.lua) all read
-- the hold's status and Redis's clock in one atomic step, so a confirm that races the expiry
-- has exactly one winner: at or after `expires_ms` the hold expires here (its units come
-- back, once) and the confirm is refused with `expired`.
local op, id, caller = ARGV[1], ARGV[2], ARGV[3]
local h = unpack_hold(redis.call('HGET', KEYS[4], id))
if not h or (caller ~= '' and caller ~= h.user) then
  return {0, '', 0}
end
-- Before anything is read as the hold's status: an older state's `held` may have ended
-- otherwise in the ledger.
local unfit = state_unfit(ARGV[4])
if unfit then
  return {unfit == 'lost' and -1 or -3, '', 0}
end
local head = redis.call('HMGET', KEYS[1], 'seq')
local want = op == 'confirm' and 'confirmed' or 'cancelled'
if h.status == want then
  return {1, want, h.expires}
end
if h.status ~= 'held' then
  return {2, h.status, h.expires}
end
local now = redis_now()
local seq = tonumber(head[1])
if now >= h.expires then
  seq = end_hold(id, h, 'expired', now, seq)
  redis.call('HSET', KEYS[1], 'seq', seq)
  return {2, 'expired', h.expires}
end
if op == 'cancel' then
  seq = end_hold(id, h, 'cancelled', now, seq)
  redis.call('HSET', KEYS[1], 'seq', seq)
  return {1, 'cancelled', h.expires}
end
redis.call('HSET', KEYS[4], id, pack_hold('confirmed', h.qty, h.expires, h.offer, h.user,
  h.seats))
redis.call('ZREM', KEYS[5], id)
seq = bump(seq)
local fields = { 's', change_record(id, 'confirmed', h.qty, now, seq) }
if h.offer == '1' then
  local e = unpack_entry(redis.call('HGET', KEYS[7], id))
  if e then
    redis.call('HSET', KEYS[7], id, pack_entry('claimed', e.order, e.ms, e.user, e.qty))
    fields[3] = 'w'
    fields[4] = entry_record(id, e, 'claimed', now, seq)
    if redis.call('HGET', KEYS[8], e.user) == id then
      redis.call('HDEL', KEYS[8], e.user)
    end
  end
end
redis.call('XADD', KEYS[3], '*', unpack(fields))
redis.call('HSET', KEYS[1], 'seq', seq)
return {1, 'confirmed', h.expires}
