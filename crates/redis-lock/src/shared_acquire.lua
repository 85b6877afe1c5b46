-- Take a shared hold (one of N permits of a semaphore, or a read hold of a
-- read-write lock), or renew one that is still ours.
--
-- Data model: the holds are entries {owner token -> end of lease, server ms}
-- in a sorted set. An entry whose lease ended no longer counts, whether its
-- holder released it, crashed or lost Redis. The set's own PEXPIRE outlives
-- every lease in it, so an idle name leaves no key behind.
--
-- KEYS[1]  the holds {owner token -> end of lease, server ms}
-- KEYS[2]  (read hold only) the read-write lock's writer hash
-- KEYS[3]  (read hold only) its waiting-writer marker
-- ARGV[1]  lease in milliseconds
-- ARGV[2]  owner token (one per hold)
-- ARGV[3]  N, the number of permits (every caller of a semaphore passes the
--          same N); 0: no limit (readers, renewals)
-- ARGV[4]  "take", or "renew": only refresh a hold whose lease has not ended
--
-- Returns
--   {1, 0, 1}  a hold (no fencing token: holds are not exclusive)
--   {0, ms}    refused: a writer holds the lock or waits for it (ms: its
--              lease's or its marker's PTTL), or all N are in use (ms until
--              the earliest lease ends)
--   {-2, 0}    "renew": the hold's lease had ended (it is not revived)
--
-- Races closed
--   * Check-then-add: expiry, the writer check, the count and the add are
--     one step, so two callers never both count N-1, and a reader never
--     slips in beside a writer.
--   * A dead holder keeping its hold: expired leases are dropped before
--     counting, with no sweeper process.
--   * Retried acquire (T9): a holder already in the set is refreshed, never
--     counted twice.
--   * Renewal after expiry (T8) or after release (T10): a hold whose lease
--     ended may already have been counted free and taken by someone else;
--     "renew" never adds it back.
local time = redis.call('time')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
redis.call('zremrangebyscore', KEYS[1], '-inf', now)
if not redis.call('zscore', KEYS[1], ARGV[2]) then
    if ARGV[4] == 'renew' then
        return {-2, 0}
    end
    for i = 2, #KEYS do
        if redis.call('exists', KEYS[i]) == 1 then
            return {0, redis.call('pttl', KEYS[i])}
        end
    end
    local permits = tonumber(ARGV[3])
    if permits > 0 and redis.call('zcard', KEYS[1]) >= permits then
        local first = redis.call('zrange', KEYS[1], 0, 0, 'withscores')
        return {0, tonumber(first[2]) - now}
    end
end
local lease = tonumber(ARGV[1])
redis.call('zadd', KEYS[1], now + lease, ARGV[2])
if redis.call('pttl', KEYS[1]) < lease then
    redis.call('pexpire', KEYS[1], lease)
end
return {1, 0, 1}
