-- SUBMIT (run_script): stores a new task (and its zip) and appends its job, all
-- or nothing, with created_at from Redis's clock like every other timestamp.
--
-- KEYS[1] task hash   KEYS[2] task zip   KEYS[3] stats hash   KEYS[4] jobs stream
-- ARGV[1] task id
-- ARGV[2] the zip ('' for none)
-- ARGV[3..] field, value pairs of the new record (state 'queued' among them)
--
-- Returns the jobs stream entry id.
local t = redis.call('TIME')
local now = string.format('%d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
redis.call('HSET', KEYS[1], 'created_at', now, unpack(ARGV, 3))
if ARGV[2] ~= '' then redis.call('SET', KEYS[2], ARGV[2]) end
redis.call('HINCRBY', KEYS[3], 'submitted', 1)
return redis.call('XADD', KEYS[4], '*', 'task_id', ARGV[1])
