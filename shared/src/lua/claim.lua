-- CLAIM: a worker takes a task it read from the jobs stream (queued -> running).
--
-- KEYS[1] task hash   KEYS[2] task events stream (a 'claimed' entry is appended)
-- ARGV[1] worker name
-- ARGV[2] the stream entry id it read
--
-- Returns 'running' when this call moved it from queued, or when the same worker
-- claimed it from the same entry before (a retry whose first reply was lost);
-- 'not-owner' when anyone else (or another entry) already runs it; otherwise the
-- current state (e.g. 'killed' if kill_task came first), or 'missing'.
--
-- The retry's branch writes the entry again (unchanged): Redis replicates the
-- write, so the retry's WAIT (REDIS_MIN_REPLICAS_ACK) covers the first claim,
-- which may not have reached the replicas.
local t = redis.call('TIME')
local now = string.format('%d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
local st = redis.call('HGET', KEYS[1], 'state')
if not st then return 'missing' end
if st == 'running' then
  if redis.call('HGET', KEYS[1], 'worker') == ARGV[1] and redis.call('HGET', KEYS[1], 'entry') == ARGV[2] then
    redis.call('HSET', KEYS[1], 'entry', ARGV[2])
    return 'running'
  end
  return 'not-owner'
end
if st ~= 'queued' then return st end
redis.call('HSET', KEYS[1], 'state', 'running', 'worker', ARGV[1], 'entry', ARGV[2], 'claimed_at', now)
redis.call('XADD', KEYS[2], 'MAXLEN', '~', 16, '*', 'e', 'claimed')
return 'running'
