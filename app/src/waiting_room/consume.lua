-- Use a buyer's admission for one purchase: it is gone once used, so the
-- same admission cannot buy twice.
--
-- KEYS[1]  the admitted {buyer -> "<permit owner> <admission's end, ms>"}
-- ARGV[1]  buyer
-- ARGV[2]  the admission's permit owner (from its signed token)
--
-- Returns
--   {"used", entry}  the entry removed (the caller may put it back if the
--                    purchase could not be attempted)
--   {"unknown"}      no such admission: never given, used already, replaced,
--                    or lost with Redis
--   {"lapsed"}       it had lapsed (removed)
local time = redis.call('time')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local entry = redis.call('hget', KEYS[1], ARGV[1])
if not entry then
    return {'unknown'}
end
local owner, ends = string.match(entry, '^(%S+) (%d+)$')
if owner ~= ARGV[2] then
    return {'unknown'}
end
redis.call('hdel', KEYS[1], ARGV[1])
if tonumber(ends) <= now then
    return {'lapsed'}
end
return {'used', entry}
