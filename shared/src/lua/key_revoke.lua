-- KEY_REVOKE (script-runner-ctl keys revoke): deletes a key's record and its
-- name; every api replica refuses the key from its next request on (they look
-- the key up on every request). Its tasks keep their owner, and the name goes
-- into the revoked set for good, so no later key is given it (KEY_CREATE).
--
-- KEYS[1] key names hash (name -> sha256)
-- KEYS[2] record prefix: a key record's name without the sha256 at its end
-- KEYS[3] revoked key names set
-- ARGV[1] key name
--
-- Returns 1, or 0 when no key has that name.
local old = redis.call('HGET', KEYS[1], ARGV[1])
if not old then return 0 end
redis.call('DEL', KEYS[2] .. old)
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('SADD', KEYS[3], ARGV[1])
return 1
