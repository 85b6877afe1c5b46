-- Mark a period of a periodic job done and free its lock, if we still hold
-- it.
--
-- KEYS[1]  the job's lock hash {owner token -> hold count}
-- KEYS[2]  the last period done
-- ARGV[1]  owner token
-- ARGV[2]  the period index that was run
--
-- Returns
--    0  marked done (the last period done only grows) and released
--   -1  not the owner: another instance holds the lock; nothing marked
--   -2  expired: nobody holds it; nothing marked
--
-- Races closed
--   * A run that lost its lock marking the period done: only the holder's
--     mark counts, so a run cut off by an expired lease is run again.
--   * A late mark moving the record back: the record is a maximum.
if redis.call('hexists', KEYS[1], ARGV[1]) == 1 then
    if tonumber(ARGV[2]) > tonumber(redis.call('get', KEYS[2]) or '-1') then
        redis.call('set', KEYS[2], ARGV[2])
    end
    redis.call('del', KEYS[1])
    return 0
end
return redis.call('exists', KEYS[1]) == 1 and -1 or -2
