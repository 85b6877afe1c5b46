-- Compare-and-delete release of a `lock/token` key.
--
-- KEYS[1]  the lock key (a string holding the owner token)
-- ARGV[1]  the caller's owner token
--
-- Returns 1 when the key held ARGV[1] and was deleted; 0 when it is absent
-- (the lease ran out) or holds another owner's token (the lease ran out and
-- someone else took the lock).
--
-- Race closed: a client-side GET, compare, DEL can see its own token, then
-- lose the key to expiry and a new holder between the GET and the DEL, and
-- delete the new holder's lock. A script runs atomically, so nothing can
-- happen between the comparison and the delete.
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
