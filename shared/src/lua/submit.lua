-- SUBMIT (run_script): stores a new task (its zip and stdin, if any) and appends
-- its job, all or nothing, with created_at from Redis's clock like every other
-- timestamp, and indexes it by creation time for list_tasks. Refuses, storing
-- nothing, while MAX_QUEUED_TASKS jobs are in the stream: checked here, in the
-- same step, so concurrent submits cannot pass the cap together.
--
-- KEYS[1] task hash   KEYS[2] task zip   KEYS[3] task stdin   KEYS[4] stats hash
-- KEYS[5] jobs stream   KEYS[6] task index (sorted set: task id by created_at)
-- ARGV[1] task id
-- ARGV[2] the zip ('' for none)
-- ARGV[3] the stdin bytes ('' for none)
-- ARGV[4] index horizon in ms: index entries older than this are dropped (their
--         records have expired), so the index stays bounded without a reader
-- ARGV[5] MAX_QUEUED_TASKS: jobs in the stream (waiting or running) at which
--         new work is refused
-- ARGV[6..] field, value pairs of the new record (state 'queued' among them)
--
-- Returns the jobs stream entry id; refused, the number of jobs in the stream.
local backlog = redis.call('XLEN', KEYS[5])
if backlog >= tonumber(ARGV[5]) then return backlog end
local t = redis.call('TIME')
local now = string.format('%d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
redis.call('HSET', KEYS[1], 'created_at', now, unpack(ARGV, 6))
if ARGV[2] ~= '' then redis.call('SET', KEYS[2], ARGV[2]) end
if ARGV[3] ~= '' then redis.call('SET', KEYS[3], ARGV[3]) end
redis.call('HINCRBY', KEYS[4], 'submitted', 1)
redis.call('ZADD', KEYS[6], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[6], '-inf', '(' .. (tonumber(now) - tonumber(ARGV[4])))
return redis.call('XADD', KEYS[5], '*', 'task_id', ARGV[1])
