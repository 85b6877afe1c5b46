-- gate_close.lua: close a sale's correction gate, so that no reservation
-- lands while a reconciler measures and corrects the counter.
--
-- KEYS[1]  correction gate      PREFIX:{sale:ID}:gate
-- ARGV[1]  the reconciler's token (random)
-- ARGV[2]  how long the gate may stay closed, milliseconds: it opens by
--          itself then, should the reconciler die
--
-- Returns 1 when this call closed the gate, 0 when it was closed already
-- (another reconciler is correcting: leave it to that one).
--
-- Race closed: under sustained demand a reservation lands between every
-- measurement and its compare-and-set correction (correct.lua), so the
-- correction is deferred for as long as the demand lasts, and a counter
-- above Postgres keeps admitting buyers whom Postgres refuses. With the gate
-- closed, reserve.lua answers "gated" instead of reserving, the sequence
-- stands still, and one measurement and its correction go through; buyers
-- meanwhile are told to retry (a few milliseconds' worth).
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', tonumber(ARGV[2])) then
  return 1
end
return 0
