-- SUBMIT (run_script): stores a new task (its zip and stdin, if any) and appends
-- its job, all or nothing, with created_at from Redis's clock like every other
-- timestamp, and indexes it by creation time for list_tasks. Refuses, storing
-- nothing, while MAX_QUEUED_TASKS jobs are in the stream, or while the owner
-- (the API key) is at one of its quotas: checked here, in the same step, so
-- concurrent submits cannot pass a cap together.
--
-- KEYS[1] task hash   KEYS[2] task zip   KEYS[3] task stdin   KEYS[4] stats hash
-- KEYS[5] jobs stream   KEYS[6] task index (sorted set: task id by created_at)
-- KEYS[7] owner's active tasks (sorted set: task id by created_at)
-- KEYS[8] owner's cpu ledger (sorted set: '<task id>:<cpu ms>' by finished_at)
-- KEYS[9] owner's task index (sorted set: task id by created_at)
-- KEYS[10] workspace hash (named but untouched without a workspace)
-- KEYS[11] owner's workspace index (sorted set: workspace id by created_at)
-- KEYS[12] every workspace (sorted set: workspace id by last use)
-- ARGV[1] task id
-- ARGV[2] the zip ('' for none)
-- ARGV[3] the stdin bytes ('' for none)
-- ARGV[4] index horizon in ms: index entries older than this are dropped (their
--         records have expired), so the index stays bounded without a reader
-- ARGV[5] MAX_QUEUED_TASKS: jobs in the stream (waiting or running) at which
--         new work is refused
-- ARGV[6] owner ('' for the admin key: then no owner key is read or written)
-- ARGV[7] owner's max queued tasks ('' for no limit)
-- ARGV[8] owner's max running tasks, i.e. queued or running ('' for no limit)
-- ARGV[9] owner's cpu ms per rolling day ('' for no limit)
-- ARGV[10] workspace use: '' (none), 'new' or 'existing'
-- ARGV[11] workspace id ('' for none)
-- ARGV[12] workspace version the task starts from ('' for none; 0 is the empty one)
-- ARGV[13] '1' if that version must still be the workspace's head (the client
--          named none, and the api read the head before signing)
-- ARGV[14] workspace save grace in ms: how long after a task's end its worker
--          may still be saving its /workspace (the workspace stays busy)
-- ARGV[15..] field, value pairs of the new record (state 'queued' among them)
--
-- Every owned task goes into the owner's active tasks, whatever the request's
-- quotas (a quota added later, or by another replica's OAUTH_* settings, counts
-- earlier tasks too); the set is trimmed by the index horizon like the owner's
-- task index. While the owner has a task-count quota, an entry whose task has
-- ended (or expired) is dropped here, on the way, so the set holds little more
-- than the owner's active tasks, which the quota bounds. A quota of 0 refuses
-- every task. Ledger entries older than a day are
-- dropped too.
--
-- Returns the jobs stream entry id. Refused by MAX_QUEUED_TASKS: the number of
-- jobs in the stream. Refused by an owner's quota: {quota, limit, count,
-- frees_at}: 'max_queued' or 'max_running' with the owner's tasks counted
-- (frees_at 0: when one of them ends), or 'cpu_seconds_per_day' with the limit
-- and the use in cpu ms and frees_at the time (ms) the use falls below it.
-- Refused by its workspace: {'workspace', why, detail}: 'missing' (no such
-- workspace, or another owner's: answered alike), 'busy' (detail: the task on it),
-- 'no_version' (detail: the version asked for), 'moved' (detail: the head now).
--
-- A workspace is busy while its 'busy' task is queued or running, or has ended
-- less than the save grace ago on a worker that may still be saving it (one that
-- claimed it and was not lost, and did not refuse its spec: then it ran nothing). A new workspace is made busy with this task; an
-- existing one is made busy here, in the same step as the task, so two submits on
-- one workspace cannot both pass.
local backlog = redis.call('XLEN', KEYS[5])
if backlog >= tonumber(ARGV[5]) then return backlog end
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local now = string.format('%d', now_ms)
local owner = ARGV[6]
local max_queued, max_running = tonumber(ARGV[7]), tonumber(ARGV[8])
if owner ~= '' then
  if max_queued or max_running then
    -- A task's hash is KEYS[1] with another id at the end.
    local task_prefix = string.sub(KEYS[1], 1, #KEYS[1] - #ARGV[1])
    local queued, active = 0, 0
    for _, id in ipairs(redis.call('ZRANGE', KEYS[7], 0, -1)) do
      local st = redis.call('HGET', task_prefix .. id, 'state')
      if st == 'queued' or st == 'running' then
        active = active + 1
        if st == 'queued' then queued = queued + 1 end
      else
        redis.call('ZREM', KEYS[7], id)
      end
    end
    if max_running and active >= max_running then
      return {'max_running', max_running, active, 0}
    end
    if max_queued and queued >= max_queued then
      return {'max_queued', max_queued, queued, 0}
    end
  end
  local cpu_max = tonumber(ARGV[9])
  if cpu_max then
    local day = 86400000
    redis.call('ZREMRANGEBYSCORE', KEYS[8], '-inf', '(' .. string.format('%d', now_ms - day))
    local ledger = redis.call('ZRANGE', KEYS[8], 0, -1, 'WITHSCORES')
    local used = 0
    for i = 1, #ledger, 2 do
      used = used + (tonumber(string.match(ledger[i], ':(%d+)$')) or 0)
    end
    if used >= cpu_max then
      -- The oldest entries age out first: when enough have, it frees up.
      local left, frees_at = used, now_ms
      for i = 1, #ledger, 2 do
        left = left - (tonumber(string.match(ledger[i], ':(%d+)$')) or 0)
        frees_at = tonumber(ledger[i + 1]) + day
        if left < cpu_max then break end
      end
      return {'cpu_seconds_per_day', cpu_max, used, frees_at}
    end
  end
end
local ws_use, ws_id = ARGV[10], ARGV[11]
if ws_use == 'new' then
  if redis.call('EXISTS', KEYS[10]) == 1 then return {'workspace', 'busy', ws_id} end
elseif ws_use == 'existing' then
  local ws_owner, head, busy = unpack(redis.call('HMGET', KEYS[10], 'owner', 'head', 'busy'))
  if not ws_owner or (owner ~= '' and ws_owner ~= owner) then
    return {'workspace', 'missing', ws_id}
  end
  if busy and busy ~= '' then
    local task_prefix = string.sub(KEYS[1], 1, #KEYS[1] - #ARGV[1])
    local st, fin, worker, kind = unpack(redis.call('HMGET', task_prefix .. busy,
      'state', 'finished_at', 'worker', 'reason_kind'))
    local saving = st and worker and worker ~= '' and kind ~= 'worker-lost'
      and kind ~= 'spec-rejected'
      and tonumber(fin or '0') > now_ms - tonumber(ARGV[14])
    if st == 'queued' or st == 'running' or saving then
      return {'workspace', 'busy', busy}
    end
  end
  local base = ARGV[12]
  if ARGV[13] == '1' and base ~= head then return {'workspace', 'moved', head} end
  if base ~= '0' and redis.call('EXISTS', KEYS[10] .. ':versions:' .. base) == 0 then
    return {'workspace', 'no_version', base}
  end
end
redis.call('HSET', KEYS[1], 'created_at', now, unpack(ARGV, 15))
if ws_use == 'new' then
  redis.call('HSET', KEYS[10], 'owner', owner, 'created_at', now, 'last_used_at', now,
    'head', '0', 'next_version', '1', 'busy', ARGV[1])
  if owner ~= '' then redis.call('ZADD', KEYS[11], now, ws_id) end
  redis.call('ZADD', KEYS[12], now, ws_id)
elseif ws_use == 'existing' then
  redis.call('HSET', KEYS[10], 'busy', ARGV[1], 'last_used_at', now)
  redis.call('ZADD', KEYS[12], now, ws_id)
end
if ARGV[2] ~= '' then redis.call('SET', KEYS[2], ARGV[2]) end
if ARGV[3] ~= '' then redis.call('SET', KEYS[3], ARGV[3]) end
redis.call('HINCRBY', KEYS[4], 'submitted', 1)
local horizon = '(' .. string.format('%d', now_ms - tonumber(ARGV[4]))
redis.call('ZADD', KEYS[6], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[6], '-inf', horizon)
if owner ~= '' then
  -- Past the horizon every entry has gone: so may the sets.
  for _, k in ipairs({KEYS[7], KEYS[9]}) do
    redis.call('ZADD', k, now, ARGV[1])
    redis.call('ZREMRANGEBYSCORE', k, '-inf', horizon)
    redis.call('PEXPIRE', k, ARGV[4])
  end
end
return redis.call('XADD', KEYS[5], '*', 'task_id', ARGV[1])
