-- seat_rows.lua: tell a seated SKU's state its rows, which the waitlist's offers search for
-- the best seats (lib/lifecycle.lua offer_seats, lib/seats.lua).
--
-- KEYS[1]  the SKU state hash <prefix>:{<sku>}:state
-- ARGV[1]  the plan's rows, best first: "offset:count:prefix;..." (src/seating/plan.rs
--          `rows_spec`)
--
-- Returns 1 when written; 0 when the state is missing (nothing written: a state holding only
-- its rows would look present to a restore, which rebuilds only an absent state and writes
-- the rows itself, lua/restore_sku.lua).
--
-- Keeps I1: an offer takes only seats the plan has, and a seated SKU's offer never takes a
-- unit without its seats (without `rows` a seated SKU makes no offer: its seats go to stock).
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
redis.call('HSET', KEYS[1], 'rows', ARGV[1])
return 1
