-- restock.lua: add units that Postgres has just added to a sale.
--
-- KEYS[1]  stock counter        PREFIX:{sale:ID}:stock
-- KEYS[2]  reservation sequence PREFIX:{sale:ID}:seq
-- KEYS[3]  buyers               PREFIX:{sale:ID}:buyers
-- KEYS[4]  open reservations    PREFIX:{sale:ID}:reservations
-- KEYS[5]  origin               PREFIX:{sale:ID}:origin
-- ARGV[1]  units added (>= 1)
-- ARGV[2]  channel for "stock returned" broadcasts
-- ARGV[3]  sale id (the broadcast's message)
--
-- Returns 1 when the counter was raised, 0 when there is no counter (the next
-- warm-up reads the new stock from Postgres).
--
-- Race closed: raising the counter, bumping the sequence (so that a
-- reconciler's correction measured before this point is refused) and telling
-- every instance to drop its sold-out flag happen together; so does keeping
-- the sale's keys (PERSIST) if a reconciler had set them to expire because
-- the sale had sold out (retire.lua). Left open, and
-- harmless: a reconciler that reads Postgres after the restock committed but
-- corrects before this script runs counts the units twice; the counter then
-- stands above the truth, Postgres refuses the surplus, and the next pass
-- corrects it.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
redis.call('INCRBY', KEYS[1], tonumber(ARGV[1]))
redis.call('INCR', KEYS[2])
for i = 1, 5 do
  redis.call('PERSIST', KEYS[i])
end
redis.call('PUBLISH', ARGV[2], ARGV[3])
return 1
