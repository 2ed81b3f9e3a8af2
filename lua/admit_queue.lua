-- admit_queue.lua: one round of a SKU's admissions (lib/queue.lua prepended), by the gateway
-- holding the SKU's admission lease; or the release of that lease.
--
-- KEYS[1..11] the queue keys (see lib/queue.lua)
-- ARGV[1]    the caller's owner token (one per gateway process)
-- ARGV[2]    the lease, ms
-- ARGV[3]    most tickets to admit in this round
-- ARGV[4]    "release": give the lease up (at shutdown) and admit nothing; "" otherwise
-- ARGV[5]    floor: the ledger's mark and incarnation of the SKU's state (see lib/fresh.lua)
-- ARGV[6]    the line's floor (lib/queue.lua)
--
-- Returns {code, admitted, fence, waiting, now_ms}; code: 'lost' or 'stale' (fail closed: a
-- state older than the floor is closed here and nobody is admitted), 'follower'
-- (another gateway holds the lease), 'released', 'not_open' (before opens_at), 'closed' (at or
-- after closes_at), 'sold_out', 'wait' (units may come back), 'ok' (this round admitted
-- `admitted` tickets).
--
-- Invariant (I4): a ticket is admitted once: taken from the line's head and put in the
-- admitted set in this one atomic step, only by the lease's holder. The lease is checked and
-- renewed here, on Redis's clock, so a gateway that lost it (paused, partitioned, killed and
-- restarted) admits nothing more; a new holder takes the next fence and restarts the schedule.
-- Admissions follow `rate` per second of Redis's clock, at most a second's worth at once; none
-- at or after closes_at, on the same clock as claim.lua's sale window (an admission then would
-- mint a token no claim can use). Admission knows the stock: admitted tickets not yet used or
-- expired (KEYS[9]) never exceed overbook × (units in stock + live holds), rounded up, so one
-- unit back admits two visitors at the default 1.5, not a second's worth. A hold counts as one
-- unit, whatever its quantity (the bound errs towards admitting fewer). A round that admits
-- logs its tickets and their fixed expiry (KEYS[11]) in the same step, for PostgreSQL.
local me, lease, most = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local now = q_now()
local unfit = q_unfit(ARGV[5], ARGV[6])
if unfit then
  return {unfit, 0, 0, 0, now}
end
local h = redis.call('HMGET', KEYS[1], 'owner', 'lease_until', 'fence', 'last_ms', 'credit')
local owner, until_ms, fence = h[1], tonumber(h[2] or '0'), tonumber(h[3] or '0')
local waiting = redis.call('ZCARD', KEYS[2])
if ARGV[4] == 'release' then
  if owner == me then
    redis.call('HSET', KEYS[1], 'lease_until', 0)
  end
  return {'released', 0, fence, waiting, now}
end
if owner and owner ~= me and until_ms > now then
  return {'follower', 0, fence, waiting, now}
end
local last, credit = tonumber(h[4] or now), tonumber(h[5] or '0')
if owner ~= me then
  fence = fence + 1
  last, credit = now, 0
  redis.call('HSET', KEYS[1], 'owner', me, 'fence', fence)
end
redis.call('HSET', KEYS[1], 'lease_until', now + lease)
local function idle(code)
  redis.call('HSET', KEYS[1], 'last_ms', now, 'credit', 0)
  return {code, 0, fence, waiting, now}
end
if now < q_num(KEYS[4], 'opens_ms') then
  return idle('not_open')
end
if q_closed(now) then
  return idle('closed')
end
local supply = q_supply()
if supply ~= 'open' then
  return idle(supply)
end
local rate = q_num(KEYS[1], 'rate')
credit = math.min(credit + (now - last) * rate / 1000, math.max(1, rate))
local n = math.min(math.floor(credit), most, waiting)
if n > 0 then
  local overbook = tonumber(redis.call('HGET', KEYS[1], 'overbook_milli') or '1500')
  local units = q_num(KEYS[4], 'stock') + redis.call('ZCARD', KEYS[6])
  local cap = math.floor((overbook * units + 999) / 1000)
  redis.call('ZREMRANGEBYSCORE', KEYS[9], '-inf', now)
  local live = redis.call('ZCARD', KEYS[9])
  if live + n > cap and live > 0 then
    -- At the bound: the oldest admissions whose visitor has bought are used, not live (a
    -- bounded sweep per round; one not swept yet only makes the bound stricter).
    for _, t in ipairs(redis.call('ZRANGE', KEYS[9], 0, 255)) do
      local who = redis.call('HGET', KEYS[10], t)
      if who and tonumber(redis.call('HGET', KEYS[7], who) or '0') > 0 then
        redis.call('ZREM', KEYS[9], t)
      end
    end
    live = redis.call('ZCARD', KEYS[9])
  end
  n = math.max(0, math.min(n, cap - live))
end
local admitted = 0
if n > 0 then
  local popped = redis.call('ZPOPMIN', KEYS[2], n)
  local exp = now + q_num(KEYS[1], 'ttl_ms')
  local add, exps, lives, exps_tickets = {}, {}, {}, {}
  for i = 1, #popped, 2 do
    add[#add + 1] = now
    add[#add + 1] = popped[i]
    exps[#exps + 1] = popped[i]
    exps[#exps + 1] = exp
    lives[#lives + 1] = exp
    lives[#lives + 1] = popped[i]
    exps_tickets[#exps_tickets + 1] = popped[i]
  end
  admitted = #popped / 2
  redis.call('ZADD', KEYS[3], unpack(add))
  redis.call('ZADD', KEYS[9], unpack(lives))
  -- The token's expiry, fixed now: later ttl changes apply to later admissions only.
  redis.call('HSET', KEYS[8], unpack(exps))
  redis.call('HINCRBY', KEYS[1], 'admitted_total', admitted)
  redis.call('XADD', KEYS[11], '*', 'k', 'a', 'at', now, 'ex', exp, 'n', q_next(), 't',
    table.concat(exps_tickets))
  if q_num(KEYS[1], 'first_ms') == 0 then
    redis.call('HSET', KEYS[1], 'first_ms', now)
  end
end
credit = credit - admitted
if admitted == waiting then
  -- Nobody left waiting: no credit is banked for a burst at the next joiners.
  credit = 0
end
redis.call('HSET', KEYS[1], 'last_ms', now, 'credit', tostring(credit))
return {'ok', admitted, fence, waiting - admitted, now}
