-- Claim one period of a periodic job: take its lock unless the period is
-- already done.
--
-- Data model: the job's lock is the reentrant lock's hash (acquire.lua), so
-- its renewal and an early release are the reentrant lock's. Beside it, the
-- index of the last period completed, which only grows and never expires
-- (one integer per job name).
--
-- KEYS[1]  the job's lock hash {owner token -> hold count}
-- KEYS[2]  the fencing counter
-- KEYS[3]  the last period done (an integer; absent: none)
-- ARGV[1]  lease in milliseconds
-- ARGV[2]  owner token
-- ARGV[3]  the period index the caller's clock is in
--
-- Returns
--   {1, fencing token, 1}  ours: run the job for period ARGV[3]
--   {0, pttl}              another instance is running the job now
--   {-1, last done}        period ARGV[3] (or a later one) is done already
--
-- Races closed
--   * The textbook flaw, a rerun by a clock that is behind: releasing the
--     lock after a run lets an instance whose clock still reads the same
--     period take it again. Here the period is compared with the last one
--     done, whatever any clock says, so no period runs twice.
--   * Two instances running at once: the lock is taken only when free.
--   * Retried claim (T9): an owner already holding the lock gets its grant
--     back with the same fencing token.
local holds = redis.call('hget', KEYS[1], ARGV[2])
if holds then
    redis.call('pexpire', KEYS[1], ARGV[1])
    return {1, tonumber(redis.call('get', KEYS[2]) or '0'), tonumber(holds)}
end
local done = tonumber(redis.call('get', KEYS[3]) or '-1')
if done >= tonumber(ARGV[3]) then
    return {-1, done}
end
if redis.call('exists', KEYS[1]) == 1 then
    return {0, redis.call('pttl', KEYS[1])}
end
redis.call('hset', KEYS[1], ARGV[2], 1)
redis.call('pexpire', KEYS[1], ARGV[1])
return {1, redis.call('incr', KEYS[2]), 1}
