-- return_complete.lua: give an ended order's units back to the counter and
-- its buyer back to the sale, at most once.
--
-- KEYS[1]  stock counter        PREFIX:{sale:ID}:stock
-- KEYS[2]  buyers               PREFIX:{sale:ID}:buyers
-- KEYS[3]  returns in progress  PREFIX:{sale:ID}:returns
-- KEYS[4]  reservation sequence PREFIX:{sale:ID}:seq
-- KEYS[5]  open reservations    PREFIX:{sale:ID}:reservations
-- KEYS[6]  origin               PREFIX:{sale:ID}:origin
-- ARGV[1]  order id
-- ARGV[2]  channel for "stock returned" broadcasts
-- ARGV[3]  sale id (the broadcast's message)
--
-- Returns the units returned: the entry's quantity the first time, 0 when
-- there is no entry (already completed, by the purchase path or a
-- reconciler, or dropped).
--
-- Call only once Postgres has committed the order's end. Race closed: the
-- instance that ended the order and a reconciler finishing an interrupted
-- return may both call it; deleting the entry and raising the counter are
-- one step keyed by the order id, so the units reach the counter once. The
-- buyer leaves the buyers set so that they may buy again. Keys a reconciler
-- set to expire (the sale had sold out, retire.lua) are kept again, as for a
-- restock. If the counter is gone, the units are not added to nothing: the
-- next warm-up reads them from Postgres.
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
redis.call('SREM', KEYS[2], user)
for _, i in ipairs({1, 2, 4, 5, 6}) do
  redis.call('PERSIST', KEYS[i])
end
redis.call('PUBLISH', ARGV[2], ARGV[3])
return qty
