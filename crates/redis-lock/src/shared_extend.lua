-- Renew a shared hold (a read hold or a semaphore permit) that is still ours.
--
-- KEYS[1]  the holders {owner token -> end of lease, server ms}
-- ARGV[1]  new lease in milliseconds (from now)
-- ARGV[2]  owner token
--
-- Returns
--    1  extended: the lease now ends ARGV[1] ms from now
--   -2  expired: the hold's lease had ended (it is dropped, not revived)
--
-- Races closed
--   * Extend after expiry (T8): a hold whose lease ended may already have
--     been counted free and given to someone else; it is never revived.
--   * Renewal outliving release (T10): a renewal after the release finds no
--     entry and adds none.
local time = redis.call('time')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local ends = redis.call('zscore', KEYS[1], ARGV[2])
if not ends or tonumber(ends) <= now then
    redis.call('zrem', KEYS[1], ARGV[2])
    return -2
end
local lease = tonumber(ARGV[1])
redis.call('zadd', KEYS[1], now + lease, ARGV[2])
if redis.call('pttl', KEYS[1]) < lease then
    redis.call('pexpire', KEYS[1], lease)
end
return 1
