-- correct.lua: move a sale's counter by `delta` units towards Postgres truth,
-- only if no reservation or counter change happened since it was measured.
--
-- KEYS[1]  stock counter        PREFIX:{sale:ID}:stock
-- KEYS[2]  reservation sequence PREFIX:{sale:ID}:seq
-- ARGV[1]  the sequence number the drift was measured at (inspect.lua)
-- ARGV[2]  delta, units (may be negative)
-- ARGV[3]  channel for "stock returned" broadcasts
-- ARGV[4]  sale id (the broadcast's message)
--
-- Returns {applied, change}: {1, change} when the counter moved by `change`
-- units (the delta, clamped so the counter stays >= 0), {0, 0} when the
-- sequence moved on (or the counter is gone) and nothing was changed.
--
-- Race closed: the drift was computed from a Redis snapshot and a later
-- Postgres read. A reservation opened after the snapshot but committed before
-- the read would look like drift, and "correcting" it would undersell (or,
-- for two reconcilers applying the same delta, correct twice). Every
-- reservation and every counter change bumps the sequence, so a stale
-- measurement is refused here, atomically, and retried by a later pass.
-- Compensations and confirmations leave the sequence alone: they change the
-- counter and the truth by the same amount, or neither.
if tonumber(redis.call('GET', KEYS[2]) or '0') ~= tonumber(ARGV[1]) then
  return {0, 0}
end
local counter = redis.call('GET', KEYS[1])
if not counter then
  return {0, 0}
end
counter = tonumber(counter)
local target = counter + tonumber(ARGV[2])
if target < 0 then
  target = 0
end
redis.call('SET', KEYS[1], target)
redis.call('INCR', KEYS[2])
if target > counter then
  redis.call('PUBLISH', ARGV[3], ARGV[4])
end
return {1, target - counter}
