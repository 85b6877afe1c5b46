-- Acquire or re-enter a reentrant lock and issue its fencing token.
--
-- Data model (as Redisson's RLock): KEYS[1] is a hash {owner token -> hold
-- count} with a lease set by PEXPIRE; KEYS[2] is the lock's fencing counter
-- (a plain integer, never expiring).
--
-- (`fence(issue, fenced)` comes from fencing.lua, prepended to this script.)
--
-- KEYS[1]  the lock hash
-- KEYS[2]  the fencing counter (same hash tag as KEYS[1])
-- ARGV[1]  lease in milliseconds (positive integer)
-- ARGV[2]  owner token (random, one per acquisition)
-- ARGV[3]  "acquire" (a new acquisition) or "reenter" (through a guard)
-- ARGV[4]  "1" to INCR the fencing counter on a new acquisition, "0" not to
--          (the token is then 0 and KEYS[2] is never written)
--
-- Returns
--   {1, fencing token, hold count}  acquired or re-entered; the lease is set
--                                   to ARGV[1]. The fencing token is 0 when
--                                   ARGV[4] is "0".
--   {0, pttl}                       held by another owner; pttl is its
--                                   remaining lease in ms (-1: no lease)
--   {-1, 1}                         "reenter" but another owner holds it
--   {-1, 0}                         "reenter" but nobody holds it (expired)
--
-- Races closed
--   * Check-then-set (Redisson #84): the existence check, the hold count, the
--     lease and the fencing counter change in one atomic step.
--   * Retried acquire (Redisson #7367, #4822): an "acquire" whose owner token
--     is already present is a retry of the same acquisition whose reply was
--     lost. It refreshes the lease and returns the SAME fencing token without
--     incrementing the hold count, so a retry never leaves the count at 2.
--     Only "reenter", sent through a guard, increments it.
--   * Re-entry after expiry: "reenter" never re-creates a lock that expired
--     or that another owner took since.
local holds = redis.call('hget', KEYS[1], ARGV[2])
if holds then
    if ARGV[3] == 'reenter' then
        holds = redis.call('hincrby', KEYS[1], ARGV[2], 1)
    else
        holds = tonumber(holds)
    end
    redis.call('pexpire', KEYS[1], ARGV[1])
    return {1, fence(false, ARGV[4] == '1'), holds}
end
if ARGV[3] == 'reenter' then
    return {-1, redis.call('exists', KEYS[1])}
end
if redis.call('exists', KEYS[1]) == 0 then
    redis.call('hset', KEYS[1], ARGV[2], 1)
    redis.call('pexpire', KEYS[1], ARGV[1])
    return {1, fence(true, ARGV[4] == '1'), 1}
end
return {0, redis.call('pttl', KEYS[1])}
