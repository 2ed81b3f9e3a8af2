-- leave_waitlist.lua: take a buyer's entry out of the line (declining its offer, if any).
--
-- KEYS[1..9] the lifecycle keys of the SKU (see lib/lifecycle.lua)
-- ARGV[1]    the entry id
-- ARGV[2]    the caller's user id, or "" for the admin
-- ARGV[3]    floor: the ledger's mark and incarnation (see lib/fresh.lua)
--
-- Returns {code, status}: 0 no such entry for this caller (the caller reads PostgreSQL);
-- 1 the entry has left (now or earlier: status "left"); 2 the entry had already ended
-- (status claimed or expired; nothing changes); -1 the state is missing, -3 stale or older
-- than the floor (nothing changes). The state is checked before the entry is read: an older
-- state's entry may have ended otherwise in the ledger.
--
-- Keeps I1 and I4 (docs/invariants.md).
-- Invariant: an entry leaves once; an offer it held is cancelled like any hold, so its unit
-- goes to the next in line (give_back), never lost and never doubled.
local eid, caller = ARGV[1], ARGV[2]
local unfit = state_unfit(ARGV[3])
if unfit then
  return {unfit == 'lost' and -1 or -3, ''}
end
local e = unpack_entry(redis.call('HGET', KEYS[7], eid))
if not e or (caller ~= '' and caller ~= e.user) then
  return {0, ''}
end
if e.status == 'left' then
  return {1, 'left'}
end
if e.status ~= 'waiting' and e.status ~= 'offered' then
  return {2, e.status}
end
local head = redis.call('HMGET', KEYS[1], 'seq')
local now = redis_now()
local seq = tonumber(head[1])
if e.status == 'offered' then
  local h = unpack_hold(redis.call('HGET', KEYS[4], eid))
  if h and h.status == 'held' then
    -- Declining the offer: the hold ends as cancelled, the entry as left, and its unit goes
    -- to the next in line.
    seq = end_hold(eid, h, 'cancelled', now, seq, 'left')
    redis.call('HSET', KEYS[1], 'seq', seq)
    return {1, 'left'}
  end
end
redis.call('ZREM', KEYS[6], eid)
redis.call('HSET', KEYS[7], eid, pack_entry('left', e.order, e.ms, e.user, e.qty))
if redis.call('HGET', KEYS[8], e.user) == eid then
  redis.call('HDEL', KEYS[8], e.user)
end
seq = bump(seq)
redis.call('XADD', KEYS[3], '*', 'w', entry_record(eid, e, 'left', now, seq))
redis.call('HSET', KEYS[1], 'seq', seq)
return {1, 'left'}
