-- Release one hold (or every hold) of a reentrant lock, if we own it.
-- Also the release of a fair lock (fair.lua) and of a read-write lock's
-- writer (rwlock_write.lua), which share the lock hash.
--
-- KEYS[1]  the lock hash {owner token -> hold count}
-- KEYS[2]  (fair lock only) the line of waiters {owner token -> arrival}
-- ARGV[1]  owner token
-- ARGV[2]  lease in milliseconds, restored while holds remain
-- ARGV[3]  "one" (release one hold) or "all" (the last guard: drop the owner)
-- ARGV[4]  the lock's wake-up channel; with KEYS[2], the prefix of each
--          waiter's own channel (`<name>:turn:`)
--
-- Returns
--    0  released: the hash is deleted and "released" is published on ARGV[4]
--       (fair lock: "turn" on the channel of the first live waiter only)
--   n>0 still held by the same owner n more times (lease refreshed)
--   -1  not the owner: another owner holds the lock (nothing changed)
--   -2  expired: nobody holds the lock (nothing changed)
--
-- Races closed (T-ids: the crate README's "Failure timelines")
--   * Blind DEL by a stale holder (T7): the owner is compared and the
--     hash deleted in one atomic step, so a holder whose lease ran out can
--     never delete the lock of the owner who came next.
--   * Lost count after an unknown re-entry outcome: the last guard releases
--     with "all", so the lock never stays held by an owner with no guard.
--   * Waiters sleeping until the lease ends: the PUBLISH happens in the same
--     step as the delete, so a subscribed waiter is woken as soon as the lock
--     is free (a lost message only delays it until its PTTL-bounded wait ends).
--   * Fair lock, a thundering herd: only the first waiter in line is told.
--     If it is dead, the others find out at their next heartbeat (fair.lua
--     drops waiters whose deadline passed), so a dead waiter costs the line
--     at most its waiter timeout plus one heartbeat.
if redis.call('hexists', KEYS[1], ARGV[1]) == 0 then
    if redis.call('exists', KEYS[1]) == 1 then
        return -1
    end
    return -2
end
local holds = 0
if ARGV[3] == 'one' then
    holds = redis.call('hincrby', KEYS[1], ARGV[1], -1)
end
if holds > 0 then
    redis.call('pexpire', KEYS[1], ARGV[2])
    return holds
end
redis.call('del', KEYS[1])
if #KEYS == 1 then
    redis.call('publish', ARGV[4], 'released')
    return 0
end
local first = redis.call('zrange', KEYS[2], 0, 0)[1]
if first then
    redis.call('publish', ARGV[4] .. first, 'turn')
end
return 0
