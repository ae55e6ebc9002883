-- SUBMIT (run_script): stores a new task (its zip and stdin, if any) and appends
-- its job, all or nothing, with created_at from Redis's clock like every other
-- timestamp, and indexes it by creation time for list_tasks.
--
-- KEYS[1] task hash   KEYS[2] task zip   KEYS[3] task stdin   KEYS[4] stats hash
-- KEYS[5] jobs stream   KEYS[6] task index (sorted set: task id by created_at)
-- ARGV[1] task id
-- ARGV[2] the zip ('' for none)
-- ARGV[3] the stdin bytes ('' for none)
-- ARGV[4] index horizon in ms: index entries older than this are dropped (their
--         records have expired), so the index stays bounded without a reader
-- ARGV[5..] field, value pairs of the new record (state 'queued' among them)
--
-- Returns the jobs stream entry id.
local t = redis.call('TIME')
local now = string.format('%d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
redis.call('HSET', KEYS[1], 'created_at', now, unpack(ARGV, 5))
if ARGV[2] ~= '' then redis.call('SET', KEYS[2], ARGV[2]) end
if ARGV[3] ~= '' then redis.call('SET', KEYS[3], ARGV[3]) end
redis.call('HINCRBY', KEYS[4], 'submitted', 1)
redis.call('ZADD', KEYS[6], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[6], '-inf', '(' .. (tonumber(now) - tonumber(ARGV[4])))
return redis.call('XADD', KEYS[5], '*', 'task_id', ARGV[1])
