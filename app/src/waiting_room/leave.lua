-- A buyer leaves a sale's waiting room: their place, or their admission.
--
-- KEYS[1]  the line, KEYS[2] last seen, KEYS[3] the admitted
-- ARGV[1]  buyer
--
-- Returns the permit owner of an admission the buyer held (the caller gives
-- the permit back), or false.
redis.call('zrem', KEYS[1], ARGV[1])
redis.call('zrem', KEYS[2], ARGV[1])
local entry = redis.call('hget', KEYS[3], ARGV[1])
redis.call('hdel', KEYS[3], ARGV[1])
if entry then
    return string.match(entry, '^(%S+) ')
end
return false
