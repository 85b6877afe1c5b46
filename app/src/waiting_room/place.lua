-- A buyer's place in a sale's waiting room: join the line ("join"), or look
-- at the place ("look"). Either counts as the buyer still being there: a
-- buyer not seen for a while is dropped when the line reaches them
-- (admit.lua).
--
-- KEYS[1]  the line {buyer -> ticket}; tickets only grow, so the order is
--          first come, first served across every instance
-- KEYS[2]  the ticket counter
-- KEYS[3]  last seen {buyer -> server ms of the last join or look}
-- KEYS[4]  the admitted {buyer -> "<permit owner> <admission's end, ms>"}
-- KEYS[5]  the sold-out mark (present while the sale is sold out)
-- KEYS[6]  the recent admissions {permit owner -> server ms} (the pace)
-- ARGV[1]  buyer
-- ARGV[2]  "join" or "look"
-- ARGV[3]  lifetime of the room's keys, ms (each join renews it)
-- ARGV[4]  the pace's window, ms
--
-- Returns
--   {"sold_out"}
--   {"admitted", permit owner, admission's end (server ms)}
--   {"waiting", buyers ahead, admissions in the window, window measured ms}
--   {"absent"}   ("look" only) no place: never joined, left, dropped, an
--                admission that lapsed, or a Redis that lost the line
--
-- Races closed: the check for a place and the ticket are one step, so two
-- joins of one buyer (two instances, a retried request) make one place.
local time = redis.call('time')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
if redis.call('exists', KEYS[5]) == 1 then
    -- Still a look: a buyer in line keeps the place through a sold-out
    -- spell, in case units come back.
    if redis.call('zscore', KEYS[1], ARGV[1]) then
        redis.call('zadd', KEYS[3], now, ARGV[1])
    end
    return {'sold_out'}
end
local admitted = redis.call('hget', KEYS[4], ARGV[1])
if admitted then
    local owner, ends = string.match(admitted, '^(%S+) (%d+)$')
    if tonumber(ends) > now then
        return {'admitted', owner, ends}
    end
    -- A lapsed admission: its permit is free again; the buyer may join anew.
    redis.call('hdel', KEYS[4], ARGV[1])
end
if not redis.call('zscore', KEYS[1], ARGV[1]) then
    if ARGV[2] ~= 'join' then
        return {'absent'}
    end
    redis.call('zadd', KEYS[1], redis.call('incr', KEYS[2]), ARGV[1])
    for i = 1, 3 do
        redis.call('pexpire', KEYS[i], ARGV[3])
    end
end
redis.call('zadd', KEYS[3], now, ARGV[1])
local window = tonumber(ARGV[4])
redis.call('zremrangebyscore', KEYS[6], '-inf', now - window)
local recent = redis.call('zcard', KEYS[6])
local measured = window
local oldest = redis.call('zrange', KEYS[6], 0, 0, 'withscores')
if oldest[2] then
    measured = math.min(window, math.max(1000, now - tonumber(oldest[2])))
end
return {'waiting', tostring(redis.call('zrank', KEYS[1], ARGV[1])), tostring(recent),
        tostring(measured)}
