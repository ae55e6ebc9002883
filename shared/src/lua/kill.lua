-- KILL (kill_task): a queued or running task becomes 'killed', at once and for
-- good. The worker holding a running one sees the state on its next tick and
-- stops the container; a queued one is skipped when a worker reads it.
--
-- KEYS[1] task hash   KEYS[2] task zip   KEYS[3] stats hash   KEYS[4] task stdin
-- ARGV[1] reason      ARGV[2] reason kind   ARGV[3] retention seconds
--
-- Returns {state, killed}: the state after the call and 1 if this call killed
-- it; {'missing', 0} when there is no such task.
local t = redis.call('TIME')
local now = string.format('%d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
local st = redis.call('HGET', KEYS[1], 'state')
if not st then return {'missing', 0} end
if st ~= 'queued' and st ~= 'running' then return {st, 0} end
redis.call('HSET', KEYS[1], 'state', 'killed', 'reason', ARGV[1], 'reason_kind', ARGV[2],
  'finished_at', now)
-- The zip and stdin are only read before the container starts: whoever holds
-- the task needs them no more, and a worker lost before FINISH must not leak them.
redis.call('DEL', KEYS[2], KEYS[4])
redis.call('EXPIRE', KEYS[1], ARGV[3])
redis.call('HINCRBY', KEYS[3], 'finished:killed:' .. ARGV[2], 1)
return {'killed', 1}
