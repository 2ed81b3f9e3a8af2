-- read_books.lua: the Redis side of one SKU (or one shard of it) for the SKU view, in one
-- atomic read: its state, the journal entries not yet acknowledged (with their fields), its
-- transfers out, and the markers of the restock operations PostgreSQL still has pending and of
-- the compensations of parked claims a reprocessor is working on.
--
-- KEYS[1]     the state hash <prefix>:{<sku>}:state
-- KEYS[2]     the journal <prefix>:{<sku>}:journal
-- KEYS[3]     the transfers out <prefix>:{<sku>}:xfer:out
-- KEYS[4]     the seat map <prefix>:{<sku>}:seats (claim_seats.lua; absent on a SKU sold by
--             count)
-- KEYS[5..]   restock markers <prefix>:{<sku>}:restock:<op_id> (restock.lua), then
--             compensation markers <prefix>:{<sku>}:comp:<claim_id> (compensate.lua), any number
-- ARGV[1]     consumer group ("writers")
-- ARGV[2]     the most journal entries returned
--
-- Returns {head, entries, more, transfers, markers, map}:
--   head      {stock, inflight, seq, stale, wl_pool, transfer_out, acks} (nil when absent;
--             acks: journal entries acknowledged so far, ack_journal.lua)
--   entries   {{id, {field, value, ...}}, ...}: every entry delivered to no writer yet or
--             delivered and not acknowledged, oldest first (as XRANGE returns them)
--   more      1 when more entries than ARGV[2] are unacknowledged (the list is cut), else 0
--   transfers the transfers hash as HGETALL returns it
--   markers   each marker's value, in KEYS order (nil when absent)
--   map       the seat map's bytes (nil when absent), the same instant's as the stock: the
--             view's seat counts agree with its `remaining`
--
-- Invariant: reads only. One script, so the stock, `inflight`, the entries it counts and the
-- restocks applied are one instant's (src/books.rs fences PostgreSQL's reading between two
-- of these). An entry acknowledged is never returned: its rows are in PostgreSQL.
local state, journal, group = KEYS[1], KEYS[2], ARGV[1]
local cap = tonumber(ARGV[2])
local head = redis.call('HMGET', state, 'stock', 'inflight', 'seq', 'stale', 'wl_pool',
  'transfer_out', 'acks')
local entries, more = {}, 0
if redis.call('EXISTS', journal) == 1 then
  -- Delivered and unacknowledged: the group's pending list.
  local pending = redis.pcall('XPENDING', journal, group, '-', '+', cap + 1)
  local last = '0-0'
  if type(pending) == 'table' and not pending.err then
    for _, g in ipairs(redis.call('XINFO', 'GROUPS', journal)) do
      local name, delivered = nil, nil
      for j = 1, #g, 2 do
        if g[j] == 'name' then name = g[j + 1] end
        if g[j] == 'last-delivered-id' then delivered = g[j + 1] end
      end
      if name == group and delivered then last = delivered end
    end
    for _, p in ipairs(pending) do
      if #entries >= cap then
        more = 1
        break
      end
      local e = redis.call('XRANGE', journal, p[1], p[1])
      entries[#entries + 1] = { p[1], (e[1] and e[1][2]) or {} }
    end
  end
  -- Delivered to nobody yet: everything after the group's last delivered id.
  if more == 0 then
    local left = cap - #entries
    local fresh = redis.call('XRANGE', journal, '(' .. last, '+', 'COUNT', left + 1)
    for i, e in ipairs(fresh) do
      if i > left then
        more = 1
        break
      end
      entries[#entries + 1] = e
    end
  end
end
local markers = {}
for i = 5, #KEYS do
  markers[#markers + 1] = redis.call('GET', KEYS[i])
end
return { head, entries, more, redis.call('HGETALL', KEYS[3]), markers,
  redis.call('GET', KEYS[4]) }
