-- queue_config.lua: writes a SKU's waiting-room settings (from its catalog row) into Redis.
--
-- KEYS[1]  the queue hash (see lib/queue.lua)
-- KEYS[2]  the SKU's state hash
-- ARGV[1]  admissions per second
-- ARGV[2]  how long an admission is valid, ms
-- ARGV[3]  when the pre-queue opens, unix ms (0: from the declare on)
--
-- Returns 1 when written, 0 when Redis holds no state for the SKU (it lost it: the queue stays
-- closed until a restore brings the state back, then the next write re-arms it).
--
-- Invariant: settings only; the line, the admitted set and the lease are never touched, so a
-- rate changed while admitting takes effect at the next round without re-admitting anyone.
if redis.call('EXISTS', KEYS[2]) == 0 then
  return 0
end
redis.call('HSET', KEYS[1], 'rate', ARGV[1], 'ttl_ms', ARGV[2], 'prequeue_ms', ARGV[3])
return 1
