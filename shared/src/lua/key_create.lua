-- KEY_CREATE (script-runner-ctl keys create): records a new API key, under the
-- SHA-256 of the key (the key itself is never stored), and its name in the
-- names hash, unless a key of that name exists or one was revoked (its tasks
-- keep the name as their owner: a new key under it would inherit them).
-- created_at from Redis's clock.
--
-- KEYS[1] key names hash (name -> sha256)   KEYS[2] the new key's record hash
-- KEYS[3] revoked key names set
-- ARGV[1] key name   ARGV[2] the key's sha256
-- ARGV[3..] field, value pairs of the record
--
-- Returns 1; 0 (nothing written) when a key of that name exists; 2 (nothing
-- written) when a key of that name was revoked.
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then return 0 end
if redis.call('SISMEMBER', KEYS[3], ARGV[1]) == 1 then return 2 end
local t = redis.call('TIME')
local now = string.format('%d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
redis.call('HSET', KEYS[2], 'created_at', now, unpack(ARGV, 3))
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1
