-- gate_open.lua: open a sale's correction gate closed by gate_close.lua.
--
-- KEYS[1]  correction gate      PREFIX:{sale:ID}:gate
-- ARGV[1]  the token the gate was closed with
--
-- Returns 1 when the gate was this token's and is now open, 0 otherwise.
--
-- Race closed: a reconciler slower than its gate's expiry must not open a
-- gate that another reconciler closed since; only the token's owner opens.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
