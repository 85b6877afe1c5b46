-- Admit the first buyer of a sale's line who is still there, with the permit
-- the caller just took from the room's semaphore.
--
-- KEYS[1]  the line {buyer -> ticket}
-- KEYS[2]  last seen {buyer -> server ms}
-- KEYS[3]  the admitted {buyer -> "<permit owner> <admission's end, ms>"}
-- KEYS[4]  the recent admissions {permit owner -> server ms}
-- KEYS[5]  the sold-out mark
-- KEYS[6]  the fence: the highest leader's fencing token seen
-- ARGV[1]  the permit's owner token
-- ARGV[2]  how long the admission lasts, ms
-- ARGV[3]  a buyer not seen for this long has left, ms
-- ARGV[4]  lifetime of the room's keys, ms
-- ARGV[5]  the pace's window, ms
-- ARGV[6]  the admitting leader's fencing token
--
-- Returns
--   {"admitted", buyer, admission's end (server ms)}
--   {"empty"}    nobody left in line (the caller gives the permit back)
--   {"closed"}   the sale is sold out: nobody is let in
--   {"fenced"}   a newer leader has admitted since this one took the lead:
--                it counted the permits and the stock after this one did, so
--                this one's round is stale (a leader paused mid-round)
--
-- Buyers who left (not seen for ARGV[3]) are dropped on the way, at most
-- 1000 per call (then {"empty"}: the next call goes on).
local time = redis.call('time')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local fence = tonumber(redis.call('get', KEYS[6]) or '0')
if tonumber(ARGV[6]) < fence then
    return {'fenced'}
end
redis.call('set', KEYS[6], ARGV[6], 'px', ARGV[4])
if redis.call('exists', KEYS[5]) == 1 then
    return {'closed'}
end
local gone = now - tonumber(ARGV[3])
for _ = 1, 1000 do
    local head = redis.call('zrange', KEYS[1], 0, 0)[1]
    if not head then
        return {'empty'}
    end
    redis.call('zrem', KEYS[1], head)
    local seen = redis.call('zscore', KEYS[2], head)
    redis.call('zrem', KEYS[2], head)
    if seen and tonumber(seen) >= gone then
        local ends = now + tonumber(ARGV[2])
        redis.call('hset', KEYS[3], head, ARGV[1] .. ' ' .. ends)
        redis.call('pexpire', KEYS[3], ARGV[4])
        redis.call('zadd', KEYS[4], now, ARGV[1])
        redis.call('zremrangebyscore', KEYS[4], '-inf', now - tonumber(ARGV[5]))
        redis.call('pexpire', KEYS[4], ARGV[4])
        return {'admitted', head, tostring(ends)}
    end
end
return {'empty'}
