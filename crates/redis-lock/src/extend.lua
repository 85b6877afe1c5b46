-- Extend (renew) the lease of a lock we own; never re-create it.
--
-- KEYS[1]  the lock hash {owner token -> hold count}
-- ARGV[1]  new lease in milliseconds (replaces the remaining one)
-- ARGV[2]  owner token
--
-- Returns
--    1  extended: the lease is now ARGV[1]
--   -1  not the owner: another owner holds the lock (nothing changed)
--   -2  expired: nobody holds the lock (nothing changed)
--
-- Races closed (T-ids: the crate README's "Failure timelines")
--   * Extend after expiry (T8, redlock-rb #36): an extend that finds
--     the key absent or owned by someone else fails; it never re-creates it.
--   * Renewal outliving release (T10, Redisson #7272): a renewal
--     that arrives after the release finds no owner and does nothing, so the
--     released key stays gone even if the watchdog's cancel loses the race.
if redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
    redis.call('pexpire', KEYS[1], ARGV[1])
    return 1
end
if redis.call('exists', KEYS[1]) == 1 then
    return -1
end
return -2
