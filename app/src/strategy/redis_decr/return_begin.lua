-- return_begin.lua: announce that an order's units are coming back, before
-- Postgres commits the return.
--
-- KEYS[1]  returns in progress  PREFIX:{sale:ID}:returns       (hash order id -> "user:qty:ms")
-- KEYS[2]  reservation sequence PREFIX:{sale:ID}:seq
-- ARGV[1]  order id (`orders.id`)
-- ARGV[2]  user id
-- ARGV[3]  quantity, units (>= 1)
--
-- Returns 1.
--
-- Race closed: an order that ends unpaid returns its units in Postgres
-- first (the status change and `remaining_stock + qty`, one transaction),
-- then in Redis (return_complete.lua). Between the two, Postgres holds units
-- the counter does not. The entry recorded here tells the reconciler so: it
-- counts an entry's units as on their way to the counter once Postgres shows
-- the order ended, and as nothing while the order is live, so the drift it
-- measures stays 0 throughout. Bumping the sequence refuses a correction
-- measured before this entry existed (its snapshot lacks the entry, its
-- Postgres read may already include the return).
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2] .. ':' .. ARGV[3] .. ':' .. ms)
redis.call('INCR', KEYS[2])
return 1
