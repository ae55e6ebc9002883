-- FINISH: records how a task ended, as the worker recorded as holding it.
--
-- KEYS[1] task hash   KEYS[2] task zip   KEYS[3] stats hash   KEYS[4] task stdin
-- KEYS[5] task files (the collected zip)
-- ARGV[1] worker name
-- ARGV[2] terminal state
-- ARGV[3] reason kind
-- ARGV[4] reason (the sentence clients see)
-- ARGV[5] exit code ('' for none)
-- ARGV[6] retention seconds for the record
-- ARGV[7] the collected files' zip ('' or absent for none), kept as long as the record
-- ARGV[8] their listing, JSON ('' or absent for none)
--
-- Also counts the end in the per-minute hash `KEYS[3]:<unix minute>` (field
-- '<state>:<reason kind>', expiring after 2 h) that ops read for "the last hour".
--
-- Returns the state the task ends in: ARGV[2], or the terminal state it already
-- had (a kill that came first wins, and is never overwritten); 'missing'.
local t = redis.call('TIME')
local now = string.format('%d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
local st = redis.call('HGET', KEYS[1], 'state')
if not st then return 'missing' end
if redis.call('HGET', KEYS[1], 'worker') ~= ARGV[1] then return st end
if st == 'queued' or st == 'running' then
  redis.call('HSET', KEYS[1], 'state', ARGV[2], 'reason_kind', ARGV[3], 'reason', ARGV[4],
    'finished_at', now)
  if ARGV[5] ~= '' then redis.call('HSET', KEYS[1], 'exit_code', ARGV[5]) end
  redis.call('HINCRBY', KEYS[3], 'finished:' .. ARGV[2] .. ':' .. ARGV[3], 1)
  local minute = KEYS[3] .. ':' .. string.format('%d', math.floor(tonumber(t[1]) / 60))
  redis.call('HINCRBY', minute, ARGV[2] .. ':' .. ARGV[3], 1)
  redis.call('EXPIRE', minute, 7200)
  st = ARGV[2]
end
if ARGV[7] and ARGV[7] ~= '' then redis.call('SET', KEYS[5], ARGV[7], 'EX', ARGV[6]) end
if ARGV[8] and ARGV[8] ~= '' then redis.call('HSET', KEYS[1], 'files', ARGV[8]) end
redis.call('HDEL', KEYS[1], 'container')
redis.call('DEL', KEYS[2], KEYS[4])
redis.call('EXPIRE', KEYS[1], ARGV[6])
return st
