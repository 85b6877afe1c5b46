-- Count the holds of a semaphore (or the read holds of a read-write lock)
-- whose lease has not ended, on the server's clock.
--
-- KEYS[1]  the holds {owner token -> end of lease, server ms}
--
-- Returns the count. Read-only: an ended lease is not removed here (the
-- next take or release drops it), so the count is exact without a write.
local time = redis.call('time')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
return redis.call('zcount', KEYS[1], '(' .. now, '+inf')
