-- mark_stale.lua: close a SKU whose Redis state is known to be older than the ledger.
--
-- KEYS[1]  the SKU state hash <prefix>:{<sku>}:state
-- ARGV[1]  the reason, kept in the state's `stale` field for the operator
--
-- Returns 1 when the state is now marked stale, 0 when there is no state (already lost).
--
-- Keeps I1 (docs/invariants.md).
-- Invariant: a state behind PostgreSQL's high-water mark never sells again; only restore
-- (which rewrites the whole state from the ledger) clears the mark. The state hash is never
-- created here, so a lost SKU stays lost rather than half-present.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
redis.call('HSETNX', KEYS[1], 'stale', ARGV[1])
return 1
