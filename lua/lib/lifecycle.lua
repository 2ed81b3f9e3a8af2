-- lib/lifecycle.lua: shared by the scripts that end holds or give units back. It is prepended
-- to those scripts when they are loaded (src/scripts/), so each still runs as one atomic
-- script; it only defines functions.
--
-- The lifecycle keys, in this order, are KEYS[1..9] of every script that includes it:
--   1 state hash {stock, limit, inflight, seq, hold_ms, offer_ms, opens_ms, closes_ms, ...}
--   2 per-user unit counts (hash user -> units held: issued, held and confirmed)
--   3 the journal (stream): wins (field c), status changes (s), waitlist changes (w)
--   4 holds (hash claim id -> hold record, see pack_hold)
--   5 hold expiries (sorted set claim id -> expires_ms; only holds still `held`)
--   6 the waitlist's line (sorted set entry id -> join order)
--   7 waitlist entries (hash entry id -> entry record, see pack_entry)
--   8 waitlist members (hash user -> that user's current entry id)
--   9 the seat map of a seated SKU (lua/claim_seats.lua; absent on a SKU without seats)
--
-- Invariant kept by give_back: a returned unit goes to the head of the line as an offer (a
-- held claim whose id is the entry id) while anybody waits, and to open stock only when
-- nobody does, in the same atomic step, so no buyer outside the line can take it. On a
-- sharded SKU's shard under a line lease it goes to the shard's pool, which only the lines
-- are offered from (offer_pool.lua), in the SKU's join order.

local function redis_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- A hold: "status|quantity|expires_ms|offer(0/1)|len(user)|user", and on a seated SKU
-- "|bit:id,bit:id,...": its seats (their bits in the map, KEYS[9]), freed when it ends.
local function pack_hold(status, qty, expires, offer, user, seats)
  local rec = status .. '|' .. qty .. '|' .. expires .. '|' .. offer .. '|' .. #user .. '|' .. user
  if seats and seats ~= '' then
    rec = rec .. '|' .. seats
  end
  return rec
end

local function unpack_hold(rec)
  if not rec then return nil end
  local status, qty, expires, offer, len, rest =
    string.match(rec, '^(%a+)|(%d+)|(%d+)|(%d)|(%d+)|(.*)$')
  if not status then return nil end
  return { status = status, qty = tonumber(qty), expires = tonumber(expires),
           offer = offer, user = string.sub(rest, 1, tonumber(len)),
           seats = string.sub(rest, tonumber(len) + 2) }
end

-- A waitlist entry: "status|order|joined_ms|len(user)|user", and "|quantity" when it waits
-- for more than one unit (a seated SKU's entry asks for the best seats for N).
local function pack_entry(status, order, ms, user, qty)
  local rec = status .. '|' .. order .. '|' .. ms .. '|' .. #user .. '|' .. user
  if qty and qty > 1 then
    rec = rec .. '|' .. qty
  end
  return rec
end

local function unpack_entry(rec)
  if not rec then return nil end
  local status, order, ms, len, rest = string.match(rec, '^(%a+)|(%d+)|(%d+)|(%d+)|(.*)$')
  if not status then return nil end
  len = tonumber(len)
  return { status = status, order = tonumber(order), ms = tonumber(ms),
           user = string.sub(rest, 1, len),
           qty = tonumber(string.match(string.sub(rest, len + 1), '^|(%d+)$') or '1') }
end

-- Journal records of a status change ("claim_id|status|quantity|ms|seq") and of a waitlist
-- change ("entry_id|status|order|ms|seq|len(user)|user", and "|quantity" as in pack_entry).
local function change_record(id, status, qty, ms, seq)
  return id .. '|' .. status .. '|' .. qty .. '|' .. ms .. '|' .. seq
end

local function entry_record(id, e, status, ms, seq)
  local rec = id .. '|' .. status .. '|' .. e.order .. '|' .. ms .. '|' .. seq .. '|' .. #e.user
    .. '|' .. e.user
  if e.qty and e.qty > 1 then
    rec = rec .. '|' .. e.qty
  end
  return rec
end

local function bump(seq)
  return seq + 1
end

-- On a seated SKU (its rows spec in the state's `rows`, written by declare and restore): offers
-- the seats that came back, with the open stock's, to the entries in line order, each entry the
-- best seats for its quantity (adjacent in one row when a row has them, else the best free
-- seats: lib/seats.lua). An entry asking for more seats than are free keeps its place and the
-- next one that fits is offered (the seats never leave the line while an entry can take them;
-- docs/seats.md). Reads at most the first 100 entries. Returns `units` less the seats offered
-- (below 0 when offers took open stock too) and `seq`.
local function offer_seats(units, now, seq, spec)
  local K = KEYS
  local cfg = redis.call('HMGET', K[1], 'limit', 'offer_ms', 'stock')
  local limit, offer_ms, stock = tonumber(cfg[1]), tonumber(cfg[2] or '0'), tonumber(cfg[3])
  -- The map's free seats: the stock, and the seats given back whose bits are already clear.
  local free = stock + units
  for _, eid in ipairs(redis.call('ZRANGE', K[6], 0, 99)) do
    if free <= 0 then break end
    local e = unpack_entry(redis.call('HGET', K[7], eid))
    if not e or e.status ~= 'waiting' then
      redis.call('ZREM', K[6], eid)
    elseif tonumber(redis.call('HGET', K[2], e.user) or '0') + e.qty > limit then
      redis.call('ZREM', K[6], eid)
      seq = bump(seq)
      redis.call('HSET', K[7], eid, pack_entry('expired', e.order, e.ms, e.user, e.qty))
      redis.call('XADD', K[3], '*', 'w', entry_record(eid, e, 'expired', now, seq))
    elseif e.qty <= free then
      local bits, ids = seat_search(K[9], spec, 'b', e.qty)
      if not bits then
        bits, ids = seat_search(K[9], spec, 'f', e.qty)
      end
      if bits then
        redis.call('ZREM', K[6], eid)
        seq = bump(seq)
        local pairs_ = {}
        for i, b in ipairs(bits) do
          redis.call('SETBIT', K[9], b, 1)
          pairs_[i] = b .. ':' .. ids[i]
        end
        free = free - e.qty
        local expires = now + offer_ms
        redis.call('HINCRBY', K[2], e.user, e.qty)
        redis.call('HSET', K[4], eid,
          pack_hold('held', e.qty, expires, 1, e.user, table.concat(pairs_, ',')))
        redis.call('ZADD', K[5], expires, eid)
        redis.call('HSET', K[7], eid, pack_entry('offered', e.order, e.ms, e.user, e.qty))
        local win = 'h|' .. expires .. '|' .. eid .. '|' .. e.qty .. '|' .. now .. '|' .. free
          .. '|' .. seq .. '|' .. #e.user .. '|' .. e.user
        redis.call('XADD', K[3], '*', 'c', win, 'z', table.concat(ids, ','),
          'w', entry_record(eid, e, 'offered', now, seq))
        redis.call('HINCRBY', K[1], 'inflight', e.qty)
        units = units - e.qty
      end
    end
  end
  return units, seq
end

-- Offers up to `units` to the head of the line, one unit an entry, in line order. `seq` is
-- the state's sequence so far. Returns the units no entry took (the line ran out) and `seq`
-- after every journal entry written here. The caller writes `seq` to the state.
local function offer_line(units, now, seq)
  local K = KEYS
  local spec = redis.call('HGET', K[1], 'rows')
  if spec then
    return offer_seats(units, now, seq, spec)
  end
  -- A seated SKU whose rows Redis does not know (lua/seat_rows.lua) offers nothing: an offer
  -- without seats would hold a unit no seat carries.
  if redis.call('EXISTS', K[9]) == 1 then
    return units, seq
  end
  local cfg = redis.call('HMGET', K[1], 'limit', 'offer_ms', 'stock')
  local limit, offer_ms, stock = tonumber(cfg[1]), tonumber(cfg[2] or '0'), tonumber(cfg[3])
  while units > 0 do
    local head = redis.call('ZRANGE', K[6], 0, 0)
    if #head == 0 then break end
    local eid = head[1]
    redis.call('ZREM', K[6], eid)
    local e = unpack_entry(redis.call('HGET', K[7], eid))
    if e and e.status == 'waiting' then
      local held = tonumber(redis.call('HGET', K[2], e.user) or '0')
      seq = bump(seq)
      if held + 1 > limit then
        -- The user reached its limit since joining: the entry ends, the unit goes on.
        redis.call('HSET', K[7], eid, pack_entry('expired', e.order, e.ms, e.user, e.qty))
        redis.call('XADD', K[3], '*', 'w', entry_record(eid, e, 'expired', now, seq))
      else
        local expires = now + offer_ms
        redis.call('HSET', K[2], e.user, held + 1)
        redis.call('HSET', K[4], eid, pack_hold('held', 1, expires, 1, e.user))
        redis.call('ZADD', K[5], expires, eid)
        redis.call('HSET', K[7], eid, pack_entry('offered', e.order, e.ms, e.user))
        local win = 'h|' .. expires .. '|' .. eid .. '|1|' .. now .. '|' .. stock .. '|' .. seq
          .. '|' .. #e.user .. '|' .. e.user
        redis.call('XADD', K[3], '*', 'c', win, 'w', entry_record(eid, e, 'offered', now, seq))
        -- The offer is a winner not yet written, like any other.
        redis.call('HINCRBY', K[1], 'inflight', 1)
        units = units - 1
      end
    end
  end
  return units, seq
end

-- Adds `units` to open stock and tells every gateway's sold-out cache to forget this SKU
-- (src/soldout/).
local function to_stock(units)
  if units < 0 then
    -- Seated offers took open seats too (offer_seats): they leave the stock.
    redis.call('HINCRBY', KEYS[1], 'stock', units)
  elseif units > 0 then
    redis.call('HINCRBY', KEYS[1], 'stock', units)
    redis.call('PUBLISH', (string.gsub(KEYS[1], '{[^{]*$', 'units-back')), KEYS[1])
  end
end

-- Gives `units` back: offers to the head of the line first, the rest to open stock. `seq` is
-- the state's sequence so far; returns it after every journal entry written here. The caller
-- writes `seq` to the state.
--
-- A shard of a sharded SKU whose line lease is live (`wl_until`, set by every join and by the
-- feed while any of the SKU's lines has waiters: src/shards/line.rs) keeps the units in its
-- `wl_pool` instead: no single-slot script can tell which shard's head joined first, so the
-- feed offers pooled units across the lines in join-ticket order, and nobody outside the
-- lines can take them meanwhile.
local function give_back(units, now, seq)
  local lease = tonumber(redis.call('HGET', KEYS[1], 'wl_until') or '0')
  if now < lease then
    redis.call('HINCRBY', KEYS[1], 'wl_pool', units)
    return seq
  end
  local left
  left, seq = offer_line(units, now, seq)
  to_stock(left)
  return seq
end

-- Ends a held claim as `status` ('cancelled', 'expired' or 'compensated'): its units (and a
-- seated hold's seats) leave the buyer's count and come back (give_back); an offer's entry ends too. `h` is the
-- unpacked hold; `entry_end` the status an offer's entry ends with (default 'expired'; 'left'
-- when its buyer leaves the line). Returns the new `seq`. The caller writes `seq` to the state.
local function end_hold(id, h, status, now, seq, entry_end)
  local K = KEYS
  redis.call('HSET', K[4], id, pack_hold(status, h.qty, h.expires, h.offer, h.user, h.seats))
  -- A seated hold's seats are free again in the same step as its units (the map's free seats
  -- always equal the stock: I1).
  for bit in string.gmatch(h.seats, '(%d+):') do
    redis.call('SETBIT', K[9], tonumber(bit), 0)
  end
  redis.call('ZREM', K[5], id)
  if redis.call('HINCRBY', K[2], h.user, -h.qty) <= 0 then
    redis.call('HDEL', K[2], h.user)
  end
  seq = bump(seq)
  local fields = {}
  if status ~= 'compensated' then
    fields = { 's', change_record(id, status, h.qty, now, seq) }
    -- Units back in Redis whose status change is not yet written: the writer's acknowledgement
    -- adds them back (see ack_journal.lua), so the SKU view balances at every instant. (A
    -- compensated claim was never written: its units leave `persistence_pending` instead.)
    redis.call('HINCRBY', K[1], 'inflight', -h.qty)
  end
  if h.offer == '1' then
    local e = unpack_entry(redis.call('HGET', K[7], id))
    if e and e.status == 'offered' then
      local ended = entry_end or 'expired'
      redis.call('HSET', K[7], id, pack_entry(ended, e.order, e.ms, e.user, e.qty))
      fields[#fields + 1] = 'w'
      fields[#fields + 1] = entry_record(id, e, ended, now, seq)
      if redis.call('HGET', K[8], e.user) == id then
        redis.call('HDEL', K[8], e.user)
      end
    end
  end
  if #fields > 0 then
    redis.call('XADD', K[3], '*', unpack(fields))
  end
  return give_back(h.qty, now, seq)
end
