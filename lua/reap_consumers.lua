-- reap_consumers.lua: forget the consumer names of journal writers that are gone.
--
-- KEYS[1]  the winners' journal <prefix>:{<sku>}:journal
-- ARGV[1]  consumer group ("writers")
-- ARGV[2]  idle time in milliseconds after which a consumer holding nothing is gone
-- ARGV[3]  the caller's own consumer name (never removed)
--
-- Returns the names removed (an empty array when the journal or the group does not exist).
--
-- Keeps I2 (docs/invariants.md).
-- Invariant: a consumer that holds pending entries is never removed: XGROUP DELCONSUMER
-- drops them from the group's pending list, and no writer would ever take them over (a lost
-- winner). The check and the removal are one atomic step, so a writer that reads between
-- them cannot lose what it read. A live writer removed while it held nothing (idle only
-- because its SKU was quiet) is re-created by its next read.
local journal, group = KEYS[1], ARGV[1]
local min_idle, own = tonumber(ARGV[2]), ARGV[3]
if redis.call('EXISTS', journal) == 0 then
  return {}
end
local ok, consumers = pcall(redis.call, 'XINFO', 'CONSUMERS', journal, group)
if not ok then
  return {}
end
local removed = {}
for _, c in ipairs(consumers) do
  local name, pending, idle = nil, nil, nil
  for j = 1, #c, 2 do
    if c[j] == 'name' then name = c[j + 1] end
    if c[j] == 'pending' then pending = c[j + 1] end
    if c[j] == 'idle' then idle = c[j + 1] end
  end
  if name and name ~= own and pending == 0 and idle and idle >= min_idle then
    redis.call('XGROUP', 'DELCONSUMER', journal, group, name)
    removed[#removed + 1] = name
  end
end
return removed
