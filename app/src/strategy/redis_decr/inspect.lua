-- inspect.lua: one consistent snapshot of a sale's Redis state, for the
-- audit's drift figure and the reconciler. Reads only.
--
-- KEYS[1]  stock counter        PREFIX:{sale:ID}:stock
-- KEYS[2]  open reservations    PREFIX:{sale:ID}:reservations
-- KEYS[3]  reservation sequence PREFIX:{sale:ID}:seq
-- KEYS[4]  origin               PREFIX:{sale:ID}:origin
-- KEYS[5]  returns in progress  PREFIX:{sale:ID}:returns
--
-- Returns {{has_counter, counter, seq, now_ms, origin},
--          {rid1, value1, rid2, value2, ...},
--          {order1, value1, order2, value2, ...}}
-- where has_counter is 1 or 0 (then counter is 0), seq the number of
-- reservations and counter changes so far, now_ms the Redis server's clock
-- in milliseconds, origin the value warm.lua stored (0 if none), each
-- reservation "user:qty:created_ms", and each return in progress
-- (return_begin.lua) "user:qty:created_ms" under its order id.
--
-- Race closed: reading the counter, the sequence and the reservations with
-- separate commands would let a purchase slip in between and make a healthy
-- sale look drifted. In one script they describe one instant.
local counter = redis.call('GET', KEYS[1])
local seq = tonumber(redis.call('GET', KEYS[3]) or '0')
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local origin = tonumber(redis.call('GET', KEYS[4]) or '0')
local head = {counter and 1 or 0, tonumber(counter or '0'), seq, ms, origin}
return {head, redis.call('HGETALL', KEYS[2]), redis.call('HGETALL', KEYS[5])}
