-- Give back a shared hold (a read hold or a semaphore permit).
--
-- KEYS[1]  the holders {owner token -> end of lease, server ms}
-- ARGV[1]  owner token
-- ARGV[2]  the wake-up channel
--
-- Returns
--    0  released: "released" is published on ARGV[2]
--   -2  expired: the lease had already ended (nothing to give back)
--
-- Races closed
--   * A stale holder freeing someone else's permit: a permit is an owner
--     token, never a count, so a release removes only its own entry.
--   * Waiters sleeping until a lease ends: the PUBLISH is in the same step.
local time = redis.call('time')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local ends = redis.call('zscore', KEYS[1], ARGV[1])
redis.call('zrem', KEYS[1], ARGV[1])
if not ends or tonumber(ends) <= now then
    return -2
end
redis.call('publish', ARGV[2], 'released')
return 0
