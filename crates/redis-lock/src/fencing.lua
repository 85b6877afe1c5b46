-- Prepended to acquire.lua, fair.lua and rwlock_write.lua (see scripts.rs):
-- the fencing token of a grant, from the counter that each of them takes as
-- KEYS[2]. No KEYS or ARGV of its own; no race of its own (it runs inside
-- the script that calls it, in the same atomic step).
--
-- fence(issue, fenced) returns a new token when `issue` (INCR), else the
-- token this owner's acquisition already has (nobody else can have
-- incremented the counter while it held the lock); 0, with the counter left
-- alone (not even created), when not `fenced`.
local function fence(issue, fenced)
    if not fenced then
        return 0
    end
    if issue then
        return redis.call('incr', KEYS[2])
    end
    return tonumber(redis.call('get', KEYS[2]) or '0')
end
