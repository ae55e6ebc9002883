-- FINISH: records how a task ended, as the worker recorded as holding it.
--
-- KEYS[1] task hash   KEYS[2] task zip   KEYS[3] stats hash   KEYS[4] task stdin
-- KEYS[5] task files (the collected zip)
-- KEYS[6] the owner's CPU ledger   KEYS[7] the owner's usage totals
-- KEYS[8] owners by total CPU      KEYS[9] usage totals over every owner
-- KEYS[10] task events stream: a 'finished' entry when this call ends the task; it
--          expires 120 s later (keys::FINAL_EVENTS_TTL_SECONDS), or with the record
--          if that is sooner
-- ARGV[1] worker name
-- ARGV[2] terminal state
-- ARGV[3] reason kind
-- ARGV[4] reason (the sentence clients see)
-- ARGV[5] exit code ('' for none)
-- ARGV[6] retention seconds for the record
-- ARGV[7] the collected files' zip ('' or absent for none), kept as long as the record
-- ARGV[8] their listing, JSON ('' for none)
-- ARGV[9] task id
-- ARGV[10] owner the worker read at claim ('' for none)
-- ARGV[11] CPU ms ('' unknown)
-- ARGV[12] peak memory bytes ('' unknown)
-- ARGV[13] /workspace bytes ('' unknown)
-- ARGV[14] how long the CPU ledger keeps an entry, ms
-- ARGV[15] '1' if the usage is estimated by the worker (the container was gone
--          before its end could be read), '' or absent if it is the kernel's
-- ARGV[16] for a task run on a workspace that has neither a version nor a note
--          (no WS_COMMIT ran: its worker was lost, or it never ran), the note
--          saying why it made none ('' or absent: none)
--
-- Usage (ARGV[11..13]) is written whenever this worker held the task, even if
-- a kill was recorded first (the container ran), and counted once: a retried
-- FINISH finds it recorded and counts nothing. With an owner on the record
-- (equal to ARGV[10]) and a CPU figure, `<task_id>:<cpu_ms>` goes into the
-- owner's ledger by finish time (older entries are dropped), and the owner's
-- totals, the owners' ranking and the totals over every owner are counted. An
-- estimated usage is recorded and counted the same way (it is the most the task
-- could have used), with 'usage_estimated' set to '1' beside it.
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
  redis.call('XADD', KEYS[10], 'MAXLEN', '~', 16, '*', 'e', 'finished')
end
if ARGV[7] ~= '' then redis.call('SET', KEYS[5], ARGV[7], 'EX', ARGV[6]) end
if ARGV[8] ~= '' then redis.call('HSET', KEYS[1], 'files', ARGV[8]) end
local fields = {'usage_cpu_ms', 'usage_peak_memory_bytes', 'usage_workspace_bytes'}
local figures = {ARGV[11], ARGV[12], ARGV[13]}
local known, recorded = false, false
for i = 1, 3 do
  if figures[i] ~= '' then known = true end
  if redis.call('HEXISTS', KEYS[1], fields[i]) == 1 then recorded = true end
end
if known and not recorded then
  for i = 1, 3 do
    if figures[i] ~= '' then redis.call('HSET', KEYS[1], fields[i], figures[i]) end
  end
  if ARGV[15] and ARGV[15] ~= '' then redis.call('HSET', KEYS[1], 'usage_estimated', ARGV[15]) end
  local owner = redis.call('HGET', KEYS[1], 'owner')
  if owner and owner ~= '' and owner == ARGV[10] then
    local cpu = tonumber(ARGV[11]) or 0
    local peak = tonumber(ARGV[12]) or 0
    local ws = tonumber(ARGV[13]) or 0
    if ARGV[11] ~= '' then
      redis.call('ZADD', KEYS[6], now, ARGV[9] .. ':' .. ARGV[11])
      local horizon = string.format('%d', tonumber(now) - tonumber(ARGV[14]))
      redis.call('ZREMRANGEBYSCORE', KEYS[6], '-inf', '(' .. horizon)
    end
    for _, h in ipairs({KEYS[7], KEYS[9]}) do
      redis.call('HINCRBY', h, 'tasks', 1)
      redis.call('HINCRBY', h, 'cpu_ms', cpu)
      redis.call('HINCRBY', h, 'workspace_bytes', ws)
      if peak > (tonumber(redis.call('HGET', h, 'peak_memory_bytes')) or 0) then
        redis.call('HSET', h, 'peak_memory_bytes', ARGV[12])
      end
    end
    redis.call('ZINCRBY', KEYS[8], cpu, owner)
  end
end
if ARGV[16] and ARGV[16] ~= '' then
  local ws, v, note = unpack(redis.call('HMGET', KEYS[1], 'workspace_id', 'workspace_version', 'workspace_note'))
  if ws and not v and not note then redis.call('HSET', KEYS[1], 'workspace_note', ARGV[16]) end
end
redis.call('HDEL', KEYS[1], 'container')
redis.call('DEL', KEYS[2], KEYS[4])
redis.call('EXPIRE', KEYS[1], ARGV[6])
redis.call('EXPIRE', KEYS[10], math.min(tonumber(ARGV[6]), 120))
return st
