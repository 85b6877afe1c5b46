-- Take a fair lock in arrival order, wait in line, or leave the line.
--
-- Data model: the lock itself is the reentrant lock's hash (acquire.lua), so
-- release.lua, extend.lua and re-entry work unchanged. Beside it, as
-- Redisson's RFairLock: a line of waiters ordered by arrival, and each
-- waiter's deadline, after which a waiter that stopped coming back (a dead
-- process) is dropped from the line. Times are the Redis server's clock, so
-- client clocks never decide an order or a deadline.
--
-- (`fence(issue, fenced)` comes from fencing.lua, prepended to this script.)
--
-- KEYS[1]  the lock hash {owner token -> hold count}
-- KEYS[2]  the fencing counter
-- KEYS[3]  the line {owner token -> arrival, server microseconds}
-- KEYS[4]  the waiters' deadlines {owner token -> server ms}
-- KEYS[5]  the line's pace {last -> server ms of the last grant, pace -> the
--          smoothed ms from a grant to the next grant to a waiter in line}
-- ARGV[1]  lease in milliseconds
-- ARGV[2]  owner token (one per acquisition)
-- ARGV[3]  "try" (take it only if free and nobody waits), "wait" (take it
--          if it is our turn, else join or stay in line), or "leave" (out of
--          the line, and out of the lock if a grant we never heard of made
--          us its holder)
-- ARGV[4]  waiter timeout in ms: a waiter's deadline is now + this, renewed
--          by each of its attempts
-- ARGV[5]  the prefix of each waiter's own wake-up channel (`<name>:turn:`)
-- ARGV[6]  "1" to issue fencing tokens from KEYS[2], "0" not to (the token
--          is then 0 and KEYS[2] is never written)
-- ARGV[7]  "wait": what is left of the caller's wait, in ms
--
-- Returns
--   {1, fencing token, hold count}  ours (a retry whose reply was lost gets
--                                   the same token back)
--   {0, pttl}                       not our turn; pttl is the holder's
--                                   remaining lease (-2: free, someone else
--                                   is first in line)
--   {-1, 0}                         "leave": out of the line
--   {-2, predicted wait ms}         "wait": not let into the line, whose
--                                   waiters ahead would take more than half
--                                   of what is left of the caller's wait
--
-- Races closed
--   * Barging: a newcomer never takes a free lock while others wait; only
--     the first waiter in line does.
--   * A dead waiter blocking the line forever: every call first drops the
--     waiters whose deadline passed.
--   * A lost turn message: when the lock is free and the first waiter has
--     not taken it, every other waiter's call tells it again.
--   * Retried acquire (T9): an owner already holding the lock gets its grant
--     back, with the same fencing token and hold count.
--   * A line longer than a wait can serve: under a spike, a line that lets
--     everyone in is served from its head, the oldest waiter, whose wait is
--     about to end; by the time its turn reaches it, it has given up, and so
--     has the next, and the lock stays free while the line is full. A
--     newcomer is let in only if the waiters ahead of it, at the line's
--     pace, would be served within half of its wait, so that whoever reaches
--     the head still has time to take the lock; the other half is the margin
--     for hand-overs slower than the pace. The pace is the time from a grant
--     to the next grant to a waiter in line, smoothed as TCP smooths its
--     round-trip time (RFC 6298: new = 7/8 old + 1/8 sample), and forgotten
--     with the line.
--   * A spike before the pace is known: a line without a pace would let in
--     every newcomer, and a spike that arrives faster than the first
--     hand-over fills it beyond what a wait can serve before it is timed.
--     Until then the pace is taken as the time since the last grant, a
--     floor of the current hold that grows while it lasts: the longer the
--     first hold, the fewer are let in behind it.
local time = redis.call('time')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
for _, dead in ipairs(redis.call('zrangebyscore', KEYS[4], '-inf', now)) do
    redis.call('zrem', KEYS[3], dead)
    redis.call('zrem', KEYS[4], dead)
end
local free = redis.call('exists', KEYS[1]) == 0
if ARGV[3] == 'leave' then
    redis.call('zrem', KEYS[3], ARGV[2])
    redis.call('zrem', KEYS[4], ARGV[2])
    if redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
        redis.call('del', KEYS[1])
        free = true
    end
    local first = redis.call('zrange', KEYS[3], 0, 0)[1]
    if free and first then
        redis.call('publish', ARGV[5] .. first, 'turn')
    end
    return {-1, 0}
end
local holds = redis.call('hget', KEYS[1], ARGV[2])
if holds then
    redis.call('pexpire', KEYS[1], ARGV[1])
    return {1, fence(false, ARGV[6] == '1'), tonumber(holds)}
end
local first = redis.call('zrange', KEYS[3], 0, 0)[1]
if free and (first == nil or first == ARGV[2]) then
    -- The pace: sampled at each grant to the first in line, from the grant
    -- before it, which is the grant of the holder it waited behind (a
    -- waiter joins the line only while the lock is held). Every grant to a
    -- caller that would wait records its time, so the first hand-over in a
    -- line is timed already; a "try" (which never waits) writes nothing
    -- where no line has formed.
    if first then
        local last = tonumber(redis.call('hget', KEYS[5], 'last'))
        if last then
            local pace = tonumber(redis.call('hget', KEYS[5], 'pace'))
            local sample = now - last
            redis.call('hset', KEYS[5], 'pace', pace and (7 * pace + sample) / 8 or sample)
        end
    end
    if first or ARGV[3] == 'wait' or redis.call('exists', KEYS[5]) == 1 then
        redis.call('hset', KEYS[5], 'last', now)
        redis.call('pexpire', KEYS[5], ARGV[4])
    end
    redis.call('hset', KEYS[1], ARGV[2], 1)
    redis.call('pexpire', KEYS[1], ARGV[1])
    redis.call('zrem', KEYS[3], ARGV[2])
    redis.call('zrem', KEYS[4], ARGV[2])
    return {1, fence(true, ARGV[6] == '1'), 1}
end
if free then
    redis.call('publish', ARGV[5] .. first, 'turn')
end
if ARGV[3] == 'wait' then
    if not redis.call('zscore', KEYS[3], ARGV[2]) then
        -- Predicted wait: the waiters ahead, and the holder, one pace each.
        -- Before a hand-over in line has been timed, the pace is taken as
        -- the time since the last grant (at least 1 ms): a floor of the
        -- current hold, which grows while that hold lasts.
        local ahead = redis.call('zcard', KEYS[3])
        if ahead > 0 then
            local pace = tonumber(redis.call('hget', KEYS[5], 'pace'))
            if not pace then
                local last = tonumber(redis.call('hget', KEYS[5], 'last'))
                pace = last and math.max(now - last, 1) or 1
            end
            if (ahead + 1) * pace > tonumber(ARGV[7]) / 2 then
                return {-2, math.ceil((ahead + 1) * pace)}
            end
        end
        redis.call('zadd', KEYS[3], tonumber(time[1]) * 1000000 + tonumber(time[2]), ARGV[2])
    end
    local timeout = tonumber(ARGV[4])
    redis.call('zadd', KEYS[4], now + timeout, ARGV[2])
    for _, key in ipairs({KEYS[3], KEYS[4], KEYS[5]}) do
        if redis.call('pttl', key) < timeout then
            redis.call('pexpire', key, timeout)
        end
    end
end
return {0, redis.call('pttl', KEYS[1])}
