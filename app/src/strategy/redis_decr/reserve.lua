-- reserve.lua: take `qty` units of a flash sale's stock for one buyer.
--
-- KEYS[1]  stock counter        PREFIX:{sale:ID}:stock         (string, integer)
-- KEYS[2]  buyers               PREFIX:{sale:ID}:buyers        (set of user ids)
-- KEYS[3]  open reservations    PREFIX:{sale:ID}:reservations  (hash rid -> "user:qty:ms")
-- KEYS[4]  reservation sequence PREFIX:{sale:ID}:seq           (string, integer)
-- KEYS[5]  correction gate      PREFIX:{sale:ID}:gate          (string, see gate_close.lua)
-- ARGV[1]  user id
-- ARGV[2]  quantity, units (>= 1)
-- ARGV[3]  reservation id (unique, chosen by the caller)
--
-- Returns {status, counter}:
--   { 1, left}  reserved; `left` units remain after this reservation
--   { 0, left}  sold out: fewer than `qty` units remain (`left`, unchanged)
--   {-1, 0}     this user already holds a reservation or an order
--   {-2, 0}     no counter: the sale is not warmed in this Redis (new, or
--               lost with a restart); warm it from Postgres and call again
--   {-3, 0}     the correction gate is closed: a reconciler is correcting
--               the counter for a few milliseconds; try again shortly
--
-- Races closed: the de-duplication check, the decrement and the record of
-- the reservation are one atomic step, so a fast double click cannot take two
-- units for one user (hfbin/Seckill #14), and no failure between "decrement"
-- and "remember what to give back" can lose a unit. A decrement below zero is
-- undone inside the same script, so no other client ever sees a negative
-- counter and wrongly answers "sold out" while stock exists
-- (codingXiaxw/seckill #16). The reservation's timestamp is the Redis
-- server's clock (TIME), so every instance's reconciler ages it alike.
local counter = redis.call('GET', KEYS[1])
if not counter then
  return {-2, 0}
end
if redis.call('SISMEMBER', KEYS[2], ARGV[1]) == 1 then
  return {-1, 0}
end
if redis.call('EXISTS', KEYS[5]) == 1 then
  return {-3, 0}
end
local qty = tonumber(ARGV[2])
local left = redis.call('DECRBY', KEYS[1], qty)
if left < 0 then
  redis.call('INCRBY', KEYS[1], qty)
  return {0, left + qty}
end
redis.call('SADD', KEYS[2], ARGV[1])
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
redis.call('HSET', KEYS[3], ARGV[3], ARGV[1] .. ':' .. ARGV[2] .. ':' .. ms)
redis.call('INCR', KEYS[4])
return {1, left}
