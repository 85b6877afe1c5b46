-- retire.lua: let a finished sale's keys expire.
--
-- KEYS[1]  stock counter        PREFIX:{sale:ID}:stock
-- KEYS[2]  buyers               PREFIX:{sale:ID}:buyers
-- KEYS[3]  open reservations    PREFIX:{sale:ID}:reservations
-- KEYS[4]  reservation sequence PREFIX:{sale:ID}:seq
-- KEYS[5]  origin               PREFIX:{sale:ID}:origin
-- ARGV[1]  the sequence number the books were found settled at (inspect.lua)
-- ARGV[2]  time to live, milliseconds
--
-- Returns 1 when the keys were set to expire, 0 when the sale moved on since
-- it was measured (a reservation, a correction, a restock) or still has an
-- open reservation: nothing is changed then.
--
-- Race closed: the reconciler found the sale ended or sold out, with no
-- drift and no reservation left, from a snapshot and a later Postgres read.
-- Anything that happened to the sale since bumps the sequence or opens a
-- reservation, and is refused here atomically, so keys still in use are
-- never set to expire. A restock afterwards (restock.lua) keeps them again.
if tonumber(redis.call('GET', KEYS[4]) or '0') ~= tonumber(ARGV[1]) then
  return 0
end
if redis.call('HLEN', KEYS[3]) > 0 then
  return 0
end
for i = 1, 5 do
  redis.call('PEXPIRE', KEYS[i], tonumber(ARGV[2]))
end
return 1
