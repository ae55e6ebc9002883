-- KILL (kill_task): a queued or running task becomes 'killed', at once and for
-- good. The worker holding a running one sees the state on its next tick and
-- stops the container; a queued one is skipped when a worker reads it.
--
-- KEYS[1] task hash   KEYS[2] task zip   KEYS[3] stats hash   KEYS[4] task stdin
-- KEYS[5] task events stream: a 'killed' entry; it expires 120 s later
--          (keys::FINAL_EVENTS_TTL_SECONDS), or with the record if that is sooner
-- ARGV[1] reason      ARGV[2] reason kind   ARGV[3] retention seconds
-- ARGV[4] owner of the caller ('' for the admin key): a task of another owner
--         is answered as missing, untouched
--
-- Also counts the kill in the per-minute hash `KEYS[3]:<unix minute>` (field
-- 'killed:<reason kind>', expiring after 2 h) that ops read for "the last hour".
--
-- Returns {state, killed}: the state after the call and 1 if this call killed
-- it; {'missing', 0} when there is no such task.
--
-- A task already killed has its state written again (unchanged): Redis
-- replicates the write, so a retried kill's WAIT (REDIS_MIN_REPLICAS_ACK)
-- covers the first kill, which may not have reached the replicas.
local t = redis.call('TIME')
local now = string.format('%d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
local rec = redis.call('HMGET', KEYS[1], 'state', 'owner')
local st = rec[1]
if not st then return {'missing', 0} end
if ARGV[4] ~= '' and rec[2] ~= ARGV[4] then return {'missing', 0} end
if st == 'killed' then
  redis.call('HSET', KEYS[1], 'state', 'killed')
  return {st, 0}
end
if st ~= 'queued' and st ~= 'running' then return {st, 0} end
redis.call('HSET', KEYS[1], 'state', 'killed', 'reason', ARGV[1], 'reason_kind', ARGV[2],
  'finished_at', now)
-- The zip and stdin are only read before the container starts: whoever holds
-- the task needs them no more, and a worker lost before FINISH must not leak them.
redis.call('DEL', KEYS[2], KEYS[4])
redis.call('EXPIRE', KEYS[1], ARGV[3])
redis.call('XADD', KEYS[5], 'MAXLEN', '~', 16, '*', 'e', 'killed')
redis.call('EXPIRE', KEYS[5], math.min(tonumber(ARGV[3]), 120))
redis.call('HINCRBY', KEYS[3], 'finished:killed:' .. ARGV[2], 1)
local minute = KEYS[3] .. ':' .. string.format('%d', math.floor(tonumber(t[1]) / 60))
redis.call('HINCRBY', minute, 'killed:' .. ARGV[2], 1)
redis.call('EXPIRE', minute, 7200)
return {'killed', 1}
