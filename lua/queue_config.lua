-- queue_config.lua: writes a SKU's waiting-room settings (from its catalog row) into Redis,
-- unless Redis holds a later version of them.
--
-- KEYS[1]  the queue hash (see lib/queue.lua)
-- KEYS[2]  the SKU's state hash
-- ARGV[1]  admissions per second
-- ARGV[2]  how long an admission is valid, ms
-- ARGV[3]  when the pre-queue opens, unix ms (0: from the declare on)
-- ARGV[4]  overbook, thousandths (admitted and unused tickets per unit that can be sold)
-- ARGV[5]  the settings' version (skus.queue_version: every declare with a queue adds one)
--
-- Returns 1 when written or when Redis already holds a later version, 0 when Redis holds no
-- state for the SKU (it lost it: the queue stays closed until a restore brings the state back,
-- then the next write re-arms it).
--
-- Invariant: settings only; the line, the admitted set and the lease are never touched, so a
-- rate changed while admitting takes effect at the next round without re-admitting anyone.
-- Every gateway writes the settings it read from the catalog every few seconds: the version
-- keeps one that read the row before an operator's change from putting the older rate back.
if redis.call('EXISTS', KEYS[2]) == 0 then
  return 0
end
local held = tonumber(redis.call('HGET', KEYS[1], 'version') or '-1')
if tonumber(ARGV[5]) < held then
  return 1
end
redis.call('HSET', KEYS[1], 'rate', ARGV[1], 'ttl_ms', ARGV[2], 'prequeue_ms', ARGV[3],
  'overbook_milli', ARGV[4], 'version', ARGV[5])
return 1
