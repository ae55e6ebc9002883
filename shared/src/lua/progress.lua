-- PROGRESS: publishes the output tails of a running task.
--
-- KEYS[1] task hash
-- ARGV[1] worker name
-- ARGV[2] stdout tail        ARGV[3] stderr tail
-- ARGV[4] stdout bytes       ARGV[5] stderr bytes
-- ARGV[6] milliseconds since the last output byte ('' when there was none yet)
--
-- Returns the current state, so the worker learns of a kill_task on every tick;
-- 'not-owner' (nothing written) if the task is no longer this worker's; 'missing'.
local t = redis.call('TIME')
local now = string.format('%d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
local st = redis.call('HGET', KEYS[1], 'state')
if not st then return 'missing' end
if redis.call('HGET', KEYS[1], 'worker') ~= ARGV[1] then return 'not-owner' end
redis.call('HSET', KEYS[1], 'stdout_tail', ARGV[2], 'stderr_tail', ARGV[3],
  'stdout_bytes', ARGV[4], 'stderr_bytes', ARGV[5])
if ARGV[6] ~= '' then
  redis.call('HSET', KEYS[1], 'last_output_at', string.format('%d', tonumber(now) - tonumber(ARGV[6])))
end
return st
