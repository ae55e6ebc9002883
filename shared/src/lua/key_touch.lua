-- KEY_TOUCH (the api, on a request with an API key): sets the key's
-- last_used_at to now by Redis's clock, unless it was set less than the
-- interval ago, so a busy key costs a write a minute, not one a request.
--
-- KEYS[1] the key's record hash
-- ARGV[1] interval in ms
--
-- Returns 1 if written, 0 if not (recent enough, or the key was revoked).
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local last = tonumber(redis.call('HGET', KEYS[1], 'last_used_at'))
if last and now - last < tonumber(ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], 'last_used_at', string.format('%d', now))
return 1
