-- ack_journal.lua: acknowledge journal entries whose winners PostgreSQL now holds.
--
-- KEYS[1]  the SKU state hash <prefix>:{<sku>}:state
-- KEYS[2]  the winners' journal <prefix>:{<sku>}:journal
-- ARGV[1]  consumer group ("writers")
-- ARGV[2k], ARGV[2k+1] for k >= 1: a stream entry id and the units it carries
--
-- Returns the number of entries acknowledged by this call.
--
-- Invariant: `inflight` drops by an entry's units exactly once, however many writers race to
-- acknowledge it (only the XACK that returns 1 counts), and the entry is deleted with it so the
-- stream holds only winners not yet written. The state hash is never created here.
local state, journal, group = KEYS[1], KEYS[2], ARGV[1]
local acked, units = 0, 0
for i = 2, #ARGV, 2 do
  if redis.call('XACK', journal, group, ARGV[i]) == 1 then
    redis.call('XDEL', journal, ARGV[i])
    acked = acked + 1
    units = units + tonumber(ARGV[i + 1])
  end
end
if units > 0 and redis.call('EXISTS', state) == 1 then
  redis.call('HINCRBY', state, 'inflight', -units)
end
return acked
