-- compensate.lua: give a reservation's units back, at most once.
--
-- KEYS[1]  stock counter        PREFIX:{sale:ID}:stock
-- KEYS[2]  buyers               PREFIX:{sale:ID}:buyers
-- KEYS[3]  open reservations    PREFIX:{sale:ID}:reservations
-- ARGV[1]  reservation id
-- ARGV[2]  "release": the buyer has no order, forget them so they may try
--          again; "keep": the buyer does have an order (Postgres refused a
--          duplicate), keep them in the buyers set
-- ARGV[3]  channel for "stock returned" broadcasts
-- ARGV[4]  sale id (the broadcast's message)
--
-- Returns the units returned: the reservation's quantity the first time, 0
-- when the reservation is unknown (already compensated, confirmed, returned by
-- the reconciler, or lost with a Redis restart).
--
-- Race closed: the purchase path, a retry after a timeout and a reconciler on
-- another instance may all try to return the same reservation. Deleting the
-- reservation and adding its units back are one atomic step keyed by the
-- reservation id, so only the first caller returns anything: the unit comes
-- back exactly once (metapi-go PR #1154: a two-step rollback lost live
-- reservations). If the counter itself is gone, the units are not added to
-- nothing: the next warm-up recomputes the counter from Postgres, where this
-- reservation no longer counts.
local value = redis.call('HGET', KEYS[3], ARGV[1])
if not value then
  return 0
end
redis.call('HDEL', KEYS[3], ARGV[1])
local user, qty = string.match(value, '^([^:]+):([^:]+):')
qty = tonumber(qty)
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('INCRBY', KEYS[1], qty)
end
if ARGV[2] == 'release' then
  redis.call('SREM', KEYS[2], user)
end
redis.call('PUBLISH', ARGV[3], ARGV[4])
return qty
