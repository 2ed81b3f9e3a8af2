-- ack_journal.lua: acknowledge journal entries whose winners PostgreSQL now holds.
--
-- KEYS[1]  the SKU state hash <prefix>:{<sku>}:state
-- KEYS[2]  the winners' journal <prefix>:{<sku>}:journal
-- KEYS[3]  holds <prefix>:{<sku>}:holds
-- KEYS[4]  waitlist entries <prefix>:{<sku>}:wl:entries
-- ARGV[1]  consumer group ("writers")
-- ARGV[2]  n, the number of entries
-- ARGV[3 + 2k], ARGV[4 + 2k] for k < n: a stream entry id (each once) and the units it
--          carries: those of all its winners (a claim.lua entry holds one call's winners),
--          negative for a cancel or expiry, whose units came back to Redis before it was written
-- ARGV[3 + 2n] m, then ARGV[4 + 2n .. 3 + 2n + m]: claims whose final status `issuances` now
--          holds: their hold records are dropped (a later confirm, cancel or GET reads
--          PostgreSQL); the rest of ARGV: waitlist entries that ended, whose records are dropped.
--          An offer's claim id is its entry's id, but its hold record goes only with the claim:
--          a parked offer's entry may end long before its claim is written or compensated, and
--          the compensation reads the hold record to know its unit already came back.
--
-- Returns the number of entries acknowledged by this call.
--
-- Keeps I2 and I4 (docs/invariants.md).
-- Invariant: `inflight` drops by an entry's units exactly once, however many writers race to
-- acknowledge it (only the XACK that returns 1 counts). The stream is then trimmed below the
-- oldest entry still pending or not yet delivered, so it holds only winners not yet written
-- (one XTRIM per batch instead of one XDEL per entry). The state hash is never created here;
-- its `acks` counts the entries acknowledged (the SKU view's fence, src/books.rs).
local state, journal, group = KEYS[1], KEYS[2], ARGV[1]
local n = tonumber(ARGV[2])
local acked, units = 0, 0
for i = 3, 2 + 2 * n, 2 do
  if redis.call('XACK', journal, group, ARGV[i]) == 1 then
    acked = acked + 1
    units = units + tonumber(ARGV[i + 1])
  end
end
if acked > 0 and redis.call('EXISTS', state) == 1 then
  if units ~= 0 then
    redis.call('HINCRBY', state, 'inflight', -units)
  end
  -- Counts every acknowledgement: the SKU view's fence (src/books.rs). An acknowledgement is
  -- the one move of Redis that follows a change of PostgreSQL's ledger (the writer commits,
  -- then acknowledges): while `acks` stands still, no entry left the journal for the ledger.
  redis.call('HINCRBY', state, 'acks', acked)
end
local m = tonumber(ARGV[3 + 2 * n] or '0')
for i = 4 + 2 * n, #ARGV do
  redis.call('HDEL', (i <= 3 + 2 * n + m) and KEYS[3] or KEYS[4], ARGV[i])
end
-- Everything below the floor is delivered and acknowledged: the oldest pending entry, or,
-- with none pending, the entry after the last one delivered to the group.
local floor = nil
local pending = redis.call('XPENDING', journal, group)
if pending[1] > 0 then
  floor = pending[2]
else
  for _, g in ipairs(redis.call('XINFO', 'GROUPS', journal)) do
    local name, last = nil, nil
    for j = 1, #g, 2 do
      if g[j] == 'name' then name = g[j + 1] end
      if g[j] == 'last-delivered-id' then last = g[j + 1] end
    end
    if name == group and last then
      local ms, seq = string.match(last, '^(%d+)-(%d+)$')
      floor = ms .. '-' .. (tonumber(seq) + 1)
    end
  end
end
if floor then
  redis.call('XTRIM', journal, 'MINID', floor)
end
return acked
