-- pending_before.lua: the journal's entries delivered to a writer and not yet acknowledged
-- that come before a given entry, with their fields: what the writer reads to tell whether a
-- hold's change may still meet its win (src/writer/order.rs).
--
-- KEYS[1]  the journal <prefix>:{<sku>}:journal
-- ARGV[1]  consumer group ("writers")
-- ARGV[2]  an entry id: only entries strictly before it are returned
-- ARGV[3]  the most entries returned
--
-- Returns {{id, consumer, fields}, ...} in journal order, `fields` the entry's
-- {field, value, ...} as XRANGE gives them (empty when the entry is no longer in the stream);
-- {} when the journal or its group does not exist.
--
-- Invariant: reads only. One atomic step, so the entries and their owners are one reading.
local journal, group = KEYS[1], ARGV[1]
if redis.call('EXISTS', journal) == 0 then
  return {}
end
local pending = redis.pcall('XPENDING', journal, group, '-', '(' .. ARGV[2], tonumber(ARGV[3]))
if type(pending) ~= 'table' or pending.err then
  return {}
end
local out = {}
for _, p in ipairs(pending) do
  local e = redis.call('XRANGE', journal, p[1], p[1])
  local fields = {}
  if e[1] then
    fields = e[1][2]
  end
  out[#out + 1] = { p[1], p[2], fields }
end
return out
