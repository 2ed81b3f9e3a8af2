-- expire_holds.lua: expire the holds of one SKU whose time has come, a bounded batch per call.
--
-- KEYS[1..9] the lifecycle keys of the SKU (see lib/lifecycle.lua)
-- KEYS[10]    the SKU's expiry lease <prefix>:{<sku>}:expiry:lease
-- ARGV[1]    the calling worker's owner token
-- ARGV[2]    lease time in milliseconds
-- ARGV[3]    most holds expired by this call
-- ARGV[4]    floor: the ledger's mark and incarnation (see lib/fresh.lua)
--
-- Returns {expired, lag_ms_1, lag_ms_2, ...}: the holds expired now, each with how long after
-- its expires_ms it expired (Redis's clock); {-1} when another worker holds the lease (nothing
-- changes); {-2} when the state is missing, or stale or older than the floor (marked stale).
--
-- Keeps I1 and I4 (docs/invariants.md).
-- Invariant: a hold expires once (only a hold still `held` and past its time), its units come
-- back once, to the waitlist's head first (give_back). The lease only spares duplicate work:
-- correctness never depends on it, so a worker that lost it mid-batch cannot double anything.
local lease, owner = KEYS[10], ARGV[1]
local current = redis.call('GET', lease)
if current and current ~= owner then
  return {-1}
end
redis.call('SET', lease, owner, 'PX', tonumber(ARGV[2]))
if state_unfit(ARGV[4]) then
  return {-2}
end
local head = redis.call('HMGET', KEYS[1], 'seq')
local now = redis_now()
local due = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now, 'LIMIT', 0, tonumber(ARGV[3]))
local seq = tonumber(head[1])
local out = {0}
for _, id in ipairs(due) do
  local h = unpack_hold(redis.call('HGET', KEYS[4], id))
  if h and h.status == 'held' then
    seq = end_hold(id, h, 'expired', now, seq)
    out[1] = out[1] + 1
    out[#out + 1] = now - h.expires
  else
    redis.call('ZREM', KEYS[5], id)
  end
end
if out[1] > 0 then
  redis.call('HSET', KEYS[1], 'seq', seq)
end
return out
