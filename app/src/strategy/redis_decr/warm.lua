-- warm.lua: set a sale's counter from Postgres truth, unless it exists.
--
-- KEYS[1]  stock counter        PREFIX:{sale:ID}:stock
-- KEYS[2]  open reservations    PREFIX:{sale:ID}:reservations
-- KEYS[3]  reservation sequence PREFIX:{sale:ID}:seq
-- KEYS[4]  origin               PREFIX:{sale:ID}:origin
-- ARGV[1]  the sale's `remaining_stock` in Postgres, units, read just before
-- ARGV[2]  channel for "stock returned" broadcasts
-- ARGV[3]  sale id (the broadcast's message)
-- ARGV[4]  the sale's origin: its `created_at` in Postgres, microseconds
--          since the Unix epoch; lets a reconciler tell this sale's keys from
--          those of a same-numbered sale in another database
--
-- Returns {created, counter}: {1, n} when this call set the counter to n,
-- {0, n} when a counter n already existed and was left alone.
--
-- Race closed: every instance warms on start of use, and after a Redis
-- restart all of them find the counter missing at once. Setting only when
-- absent, in one step, means a second instance or a restarted one can never
-- reset a running sale's counter back up to a stale figure; the first warm-up
-- wins and later ones are no-ops. Units of open reservations (if the counter
-- alone was lost) are subtracted: they are taken in Redis but not yet in
-- Postgres.
local counter = redis.call('GET', KEYS[1])
if counter then
  return {0, tonumber(counter)}
end
local open = 0
for _, value in ipairs(redis.call('HVALS', KEYS[2])) do
  local _, qty = string.match(value, '^([^:]+):([^:]+):')
  open = open + tonumber(qty)
end
local n = tonumber(ARGV[1]) - open
if n < 0 then
  n = 0
end
redis.call('SET', KEYS[1], n)
redis.call('SET', KEYS[4], ARGV[4])
redis.call('INCR', KEYS[3])
redis.call('PUBLISH', ARGV[2], ARGV[3])
return {1, n}
