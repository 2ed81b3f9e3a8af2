-- claim_seats.lua: one claim on a seated SKU, exact seats or best available, in one atomic step.
--
-- KEYS[1]  the SKU state hash {stock, limit, seq, stale, inflight, inc, opens_ms, closes_ms,
--          hold_ms}
--          <prefix>:{<sku>}:state (stock = free seats)
-- KEYS[2]  per-user seat counts (hash user -> seats held)        <prefix>:{<sku>}:users
-- KEYS[3]  the winners' journal (stream, group "writers")         <prefix>:{<sku>}:journal
-- KEYS[4]  the seat map: one bit per seat, 1 = sold or held, rows one after another in
--          declared order, most significant bit first (SETBIT's order)  <prefix>:{<sku>}:seats
-- KEYS[5]  the idempotency records (hash field -> record)          <prefix>:{<sku>}:idem
-- KEYS[6]  holds (hash claim id -> hold record, lib/lifecycle.lua's pack_hold, with the seats
--          as "bit:id,...")                                        <prefix>:{<sku>}:holds
-- KEYS[7]  hold expiries (sorted set claim id -> expires_ms)       <prefix>:{<sku>}:expiry
-- KEYS[8]  the call records hash of the claim id's bucket (claim.lua's KEYS[4])
--          <prefix>:{<sku>}:claims:<bucket>
--
-- ARGV[1]  now, unix milliseconds
-- ARGV[2]  floor "seq:inc" (lib/fresh.lua, prepended)
-- ARGV[3]  the claim id (a call of one claim: src/ids.rs, index 0)
-- ARGV[4]  the user id
-- ARGV[5]  mode: "x" exact seats, "b" best available adjacent, "f" best available, any seats
-- ARGV[6]  n, the number of seats
-- ARGV[7]  mode b/f: the candidate rows in order (best first), "offset:count:prefix;..."
--          (prefix "A-1-": a seat's id is prefix .. its number; searched by lib/seats.lua,
--          prepended with lib/fresh.lua); mode x: the seats,
--          "bit:id;bit:id;..."
-- ARGV[8]  the idempotency record's field (src/keys.rs `idempotency_field`), "" for none
-- ARGV[9]  the Idempotency-Key ("" for none)
-- ARGV[10] the request's fingerprint (a replay must be the same request)
-- ARGV[11] call records TTL in seconds
--
-- Returns {"lost"} (Redis lost the SKU), {"stale"} (state marked stale or behind the floor),
-- {"won", remaining, expires_ms (0: not held), id...}, {"replay", record} (record
-- "fingerprint|claim_id|remaining|ids|expires_ms"),
-- {"reused"} (same key, another request), {"limit", held}, {"not_open", opens_ms},
-- {"closed", closes_ms}, {"sold_out", free}, {"taken", id...} (exact seats not free),
-- {"no_adjacent", largest_block}.
--
-- A win writes, in the same step: the seats' bits, stock - n, seq + 1, inflight + n, the
-- user's count, the call's record in claim.lua's layout (so `GET /v1/claims/{id}` finds the
-- claim before the writer has it), one journal entry in claim.lua's layout (k t q r c, and x on a SKU that holds
-- its claims) plus `z`, the seat ids comma-joined, and the idempotency record when keyed. On
-- a SKU that holds its claims (hold_ms > 0) the win is a hold expiring at Redis's now +
-- hold_ms, its record carrying its seats' bits so that its end frees exactly them.
--
-- Keeps I1 (a seat's bit is set by exactly one live claim; stock always equals the map's free
-- seats), I2 (every win journaled in the same step), I3 (the limit counts seats), I4 (a replay
-- returns the same seats; docs/invariants.md, docs/seats.md).
local state, users, journal, map, idems = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local head = redis.call('HMGET', state, 'stock', 'limit', 'seq', 'stale', 'inflight', 'inc',
  'opens_ms', 'closes_ms', 'hold_ms')
if not head[1] then
  return {'lost'}
end
if head[4] or close_if_behind(head[3], head[6], ARGV[2]) then
  return {'stale'}
end
local user, mode, n = ARGV[4], ARGV[5], tonumber(ARGV[6])
local field, print = ARGV[8], ARGV[10]
if field ~= '' then
  local prior = redis.call('HGET', idems, field)
  if prior then
    -- "*": a record a restore wrote from the ledger, which keeps the seats but not the
    -- request that took them (src/restore/claims.rs): any seated request replays it.
    if string.sub(prior, 1, #print + 1) == print .. '|' or string.sub(prior, 1, 2) == '*|' then
      return {'replay', prior}
    end
    return {'reused'}
  end
end
local hold_ms, rnow = tonumber(head[9] or '0'), 0
if head[7] or head[8] or hold_ms > 0 then
  local t = redis.call('TIME')
  rnow = t[1] * 1000 + math.floor(t[2] / 1000)
  if head[7] and rnow < tonumber(head[7]) then
    return {'not_open', head[7]}
  end
  if head[8] and rnow >= tonumber(head[8]) then
    return {'closed', head[8]}
  end
end
local held = tonumber(redis.call('HGET', users, user) or '0')
if held + n > tonumber(head[2]) then
  return {'limit', held}
end
local stock = tonumber(head[1])
if stock < n then
  return {'sold_out', stock}
end

local bits, ids = {}, {}
if mode == 'x' then
  local taken = {}
  for b, id in string.gmatch(ARGV[7], '(%d+):([^;]+)') do
    if redis.call('GETBIT', map, b) == 1 then
      taken[#taken + 1] = id
    end
    bits[#bits + 1], ids[#ids + 1] = tonumber(b), id
  end
  if #taken > 0 then
    return {'taken', unpack(taken)}
  end
else
  local found, free, largest = seat_search(map, ARGV[7], mode, n)
  if not found then
    if largest then
      return {'no_adjacent', largest}
    end
    return {'sold_out', free}
  end
  bits, ids = found, free
end
for _, b in ipairs(bits) do
  redis.call('SETBIT', map, b, 1)
end
local left = stock - n
local seq = tonumber(head[3] or '0')
redis.call('HSET', state, 'stock', left, 'seq', seq + 1, 'inflight',
  tonumber(head[5] or '0') + n)
redis.call('HSET', users, user, held + n)
local key = ARGV[9]
local seats = table.concat(ids, ',')
local expires = 0
local entry = { 'k', ARGV[3], 't', ARGV[1], 'q', seq, 'r', stock,
  'c', string.format('0|%d|%d|%s%s', n, #user, user, key), 'z', seats }
if hold_ms > 0 then
  expires = rnow + hold_ms
  entry[#entry + 1], entry[#entry + 2] = 'x', expires
  local pairs = {}
  for i, b in ipairs(bits) do
    pairs[i] = b .. ':' .. ids[i]
  end
  redis.call('HSET', KEYS[6], ARGV[3], string.format('held|%d|%d|0|%d|%s|%s', n, expires, #user,
    user, table.concat(pairs, ',')))
  redis.call('ZADD', KEYS[7], expires, ARGV[3])
end
redis.call('XADD', journal, '*', unpack(entry))
local head_rec = expires > 0 and (stock .. ':' .. expires) or tostring(stock)
redis.call('HSET', KEYS[8], ARGV[3], string.format('%s|0|%d|%d|%s', head_rec, n, #user, user))
redis.call('EXPIRE', KEYS[8], tonumber(ARGV[11]))
if field ~= '' then
  redis.call('HSET', idems, field, string.format('%s|%s|%d|%s|%d', print, ARGV[3], left, seats,
    expires))
end
return {'won', left, expires, unpack(ids)}
