-- REQUEUE: puts a job back at the end of the jobs stream for any worker to
-- take, and drops the old entry, in one step (so it is never both or neither).
-- An entry that was already acknowledged (settled twice) is not put back again.
--
-- KEYS[1] jobs stream
-- ARGV[1] consumer group   ARGV[2] old entry id   ARGV[3] task id
--
-- Returns 1 if requeued, 0 if the entry was no longer pending.
if redis.call('XACK', KEYS[1], ARGV[1], ARGV[2]) == 0 then return 0 end
redis.call('XDEL', KEYS[1], ARGV[2])
redis.call('XADD', KEYS[1], '*', 'task_id', ARGV[3])
return 1
