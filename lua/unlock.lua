-- unlock.lua: release a lock only its holder may release (a SET NX PX key holding the holder's
-- token), e.g. a sharded SKU's feed lock (src/shards/feed.rs).
--
-- KEYS[1]  the lock
-- ARGV[1]  the holder's token
--
-- Returns 1 when the lock was released now, 0 when it is not held by this token (it lapsed,
-- and maybe another holder took it since: that one's is left alone).
--
-- Invariant: a holder never releases a lock another holder took after its own lapsed.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
