-- FORGET_WORKER: forgets a dead worker, only if it is still dead and holds no
-- job. Deleting a consumer drops its pending entries, so the check and the
-- delete must not be separated.
--
-- KEYS[1] jobs stream   KEYS[2] the worker's heartbeat key   KEYS[3] workers set
-- ARGV[1] consumer group   ARGV[2] worker name
--
-- Returns 1 if it was forgotten, 0 if it is alive or still holds jobs.
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
local pending = redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', 1, ARGV[2])
if #pending > 0 then return 0 end
redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
redis.call('SREM', KEYS[3], ARGV[2])
return 1
