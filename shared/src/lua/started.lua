-- STARTED: the task's container has started.
--
-- KEYS[1] task hash   KEYS[2] task events stream (a 'started' entry is appended)
-- ARGV[1] worker name
-- ARGV[2] container id
--
-- Returns 'running' if the task is still this worker's and running; else
-- 'not-owner', 'missing' or the current state: the caller must then stop the
-- container it just started.
local t = redis.call('TIME')
local now = string.format('%d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
local st = redis.call('HGET', KEYS[1], 'state')
if not st then return 'missing' end
if redis.call('HGET', KEYS[1], 'worker') ~= ARGV[1] then return 'not-owner' end
if st ~= 'running' then return st end
redis.call('HSET', KEYS[1], 'started_at', now, 'container', ARGV[2])
redis.call('XADD', KEYS[2], 'MAXLEN', '~', 16, '*', 'e', 'started')
return 'running'
