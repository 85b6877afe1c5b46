-- Take the write side of a read-write lock: one writer, no reader.
--
-- Data model: the writer is the reentrant lock's hash (acquire.lua), so its
-- re-entry, renewal (extend.lua) and release (release.lua) are the
-- reentrant lock's. Readers are a sorted set {owner token -> end of lease,
-- server ms}, one entry per read hold (shared_acquire.lua). A writer that has
-- to wait sets a marker that keeps new readers out until it got its turn.
--
-- (`fence(issue, fenced)` comes from fencing.lua, prepended to this script.)
--
-- KEYS[1]  the writer hash {owner token -> hold count}
-- KEYS[2]  the fencing counter
-- KEYS[3]  the readers {owner token -> end of lease, server ms}
-- KEYS[4]  the waiting-writer marker (a string: the waiting writer's token)
-- ARGV[1]  lease in milliseconds
-- ARGV[2]  owner token (one per acquisition)
-- ARGV[3]  how long the marker lasts without a new attempt, in ms (0: a
--          single attempt, no marker)
-- ARGV[4]  "take", or "leave": a writer that gives up drops its marker, and
--          the writer hash if a grant it never heard of made it the writer
-- ARGV[5]  the lock's wake-up channel (told when a writer leaves)
-- ARGV[6]  "1" to issue fencing tokens from KEYS[2], "0" not to (the token
--          is then 0 and KEYS[2] is never written)
--
-- Returns
--   {1, fencing token, hold count}  ours (a retry gets the same token back)
--   {0, ms}                         held: by a writer for its remaining
--                                   lease, or by readers until the last
--                                   reader lease ends
--   {-1, 0}                         "leave": done
--
-- Races closed
--   * Check-then-set between the readers' count and the writer's key: both
--     are read and the writer written in one step.
--   * A dead reader blocking writers forever: expired read leases are
--     dropped first (no per-field expiry needed).
--   * Writer starvation by a stream of readers: the marker refuses new
--     readers while a writer waits; it dies with its writer's attempts.
--   * Retried acquire (T9): the same owner gets the same grant back.
--   * Readers kept out by a writer that gave up: its marker goes with it,
--     and the readers it kept out are woken.
if ARGV[4] == 'leave' then
    if redis.call('get', KEYS[4]) == ARGV[2] then
        redis.call('del', KEYS[4])
    end
    if redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
        redis.call('del', KEYS[1])
    end
    redis.call('publish', ARGV[5], 'released')
    return {-1, 0}
end
local time = redis.call('time')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
redis.call('zremrangebyscore', KEYS[3], '-inf', now)
local holds = redis.call('hget', KEYS[1], ARGV[2])
if holds then
    redis.call('pexpire', KEYS[1], ARGV[1])
    return {1, fence(false, ARGV[6] == '1'), tonumber(holds)}
end
local writer = redis.call('exists', KEYS[1]) == 1
if not writer and redis.call('zcard', KEYS[3]) == 0 then
    redis.call('hset', KEYS[1], ARGV[2], 1)
    redis.call('pexpire', KEYS[1], ARGV[1])
    if redis.call('get', KEYS[4]) == ARGV[2] then
        redis.call('del', KEYS[4])
    end
    return {1, fence(true, ARGV[6] == '1'), 1}
end
if ARGV[3] ~= '0' then
    redis.call('set', KEYS[4], ARGV[2], 'px', ARGV[3])
end
if writer then
    return {0, redis.call('pttl', KEYS[1])}
end
local last = redis.call('zrange', KEYS[3], -1, -1, 'withscores')
return {0, tonumber(last[2]) - now}
