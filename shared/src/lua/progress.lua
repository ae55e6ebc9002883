-- PROGRESS: publishes the output tails of a running task.
--
-- KEYS[1] task hash   KEYS[2] task events stream (an 'output' entry is appended
--                     when the byte counts grew, so waiters wake on new output
--                     only; never after the end: the stream of an ended task
--                     expires, and an append then would make it again, for good)
-- ARGV[1] worker name
-- ARGV[2] stdout tail        ARGV[3] stderr tail
-- ARGV[4] stdout bytes       ARGV[5] stderr bytes
-- ARGV[6] milliseconds since the last output byte ('' when there was none yet)
-- ARGV[7] the egress log, JSON ('' to leave it as it is)
--
-- Returns the current state, so the worker learns of a kill_task on every tick;
-- 'not-owner' (nothing written) if the task is no longer this worker's; 'missing'.
local t = redis.call('TIME')
local now = string.format('%d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
local st = redis.call('HGET', KEYS[1], 'state')
if not st then return 'missing' end
if redis.call('HGET', KEYS[1], 'worker') ~= ARGV[1] then return 'not-owner' end
local before = redis.call('HMGET', KEYS[1], 'stdout_bytes', 'stderr_bytes')
if (st == 'queued' or st == 'running')
    and ((tonumber(before[1]) or 0) ~= tonumber(ARGV[4]) or (tonumber(before[2]) or 0) ~= tonumber(ARGV[5])) then
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', 16, '*', 'e', 'output')
end
redis.call('HSET', KEYS[1], 'stdout_tail', ARGV[2], 'stderr_tail', ARGV[3],
  'stdout_bytes', ARGV[4], 'stderr_bytes', ARGV[5])
if ARGV[7] ~= '' then
  redis.call('HSET', KEYS[1], 'egress_log', ARGV[7])
end
if ARGV[6] ~= '' then
  redis.call('HSET', KEYS[1], 'last_output_at', string.format('%d', tonumber(now) - tonumber(ARGV[6])))
end
return st
