-- KEY_ROTATE (script-runner-ctl keys rotate): moves a key's record from the old
-- key's SHA-256 to the new one's, so the name, scopes, limits and tasks stay
-- and the old key is refused from the next request on.
--
-- KEYS[1] key names hash (name -> sha256)   KEYS[2] the new key's record hash
-- KEYS[3] record prefix: a key record's name without the sha256 at its end
-- ARGV[1] key name   ARGV[2] the new key's sha256
--
-- Returns 1, or 0 (nothing written) when no key has that name.
local old = redis.call('HGET', KEYS[1], ARGV[1])
if not old then return 0 end
if redis.call('EXISTS', KEYS[3] .. old) == 0 then
  -- A name whose record is gone names no key: forget it.
  redis.call('HDEL', KEYS[1], ARGV[1])
  return 0
end
redis.call('RENAME', KEYS[3] .. old, KEYS[2])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1
