-- WS_COMMIT: a task's /workspace, stored whole (its manifest and every blob it
-- names are in the blob store), becomes its workspace's next version, and the
-- head moves to it; or, with no manifest, the task made no version and ARGV[8]
-- says why. Either way the workspace is no longer busy with the task. Run by the
-- worker recorded as holding the task, after its container is gone and before
-- FINISH; a kill that ended the task first does not stop it (a killed task
-- makes a version too).
--
-- KEYS[1] task hash   KEYS[2] workspace hash
-- KEYS[3] workspace versions (sorted set: version by created_at; a version's hash
--         is this key with ':<n>' appended)
-- KEYS[4] bytes each owner's workspaces hold (hash: owner to the sum of its kept
--         versions' bytes; the admin's under '')
-- KEYS[5] the blob store's sweep (hash; see WS_SWEEP)
-- ARGV[1] worker name
-- ARGV[2] task id
-- ARGV[3] manifest digest ('' when the task made no version)
-- ARGV[4] bytes in the version
-- ARGV[5] entries in the version (files, directories, links)
-- ARGV[6] the version the task started from
-- ARGV[7] versions kept per workspace: past this many, the oldest are dropped
--         (their blobs go when nothing else names them)
-- ARGV[8] why no version was made, recorded on the task when none is: the
--         reason the worker saved nothing (ARGV[3] ''), or what to say when this
--         script refuses
-- ARGV[9] the most bytes an owner's kept versions may hold together (0: no cap;
--         the admin's are not capped)
-- ARGV[10] what the task is told when the cap stops its version, with '%d' for
--         the bytes its owner's versions would hold
-- ARGV[11] the sweep's epoch when the save began (WS_SWEEP 'look')
--
-- Refuses, writing nothing, when the task is not this worker's, or the workspace
-- is gone (deleted) or busy with another task (this one ended longer than the
-- save grace ago, and the next took the workspace).
--
-- A version that would take its owner past the cap, and leave it holding more
-- than before, is not made: the workspace is freed, the head stays, and the task
-- says why (ARGV[10]). A workspace made before bytes were counted has its kept
-- versions counted first.
--
-- A version whose save began before a sweep's delete phase is refused too, writing
-- nothing, since the phase may have deleted a blob it names: the worker checks
-- its blobs again (sending any gone) and commits in the new epoch.
--
-- Returns the new version's number, 0 when none was made, or {'refused', why,
-- detail}: 'not_yours', 'not_busy', or 'sweep_moved' (detail: the epoch now).
local worker = redis.call('HGET', KEYS[1], 'worker')
if worker ~= ARGV[1] then return {'refused', 'not_yours'} end
if redis.call('HGET', KEYS[2], 'busy') ~= ARGV[2] then
  redis.call('HSET', KEYS[1], 'workspace_note', ARGV[8])
  return {'refused', 'not_busy'}
end
if ARGV[3] ~= '' then
  local epoch = redis.call('HGET', KEYS[5], 'epoch') or '0'
  if epoch ~= ARGV[11] then return {'refused', 'sweep_moved', epoch} end
end
local t = redis.call('TIME')
local now = string.format('%d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
if ARGV[3] == '' then
  redis.call('HDEL', KEYS[2], 'busy')
  redis.call('HSET', KEYS[2], 'last_used_at', now)
  redis.call('HSET', KEYS[1], 'workspace_note', ARGV[8])
  return 0
end
-- What the versions dropped below free, before the cap is checked.
local keep = tonumber(ARGV[7])
local extra = redis.call('ZCARD', KEYS[3]) + 1 - keep
local dropped, freed = {}, 0
if extra > 0 then
  dropped = redis.call('ZRANGE', KEYS[3], 0, extra - 1)
  for _, old in ipairs(dropped) do
    freed = freed + (tonumber(redis.call('HGET', KEYS[3] .. ':' .. old, 'bytes')) or 0)
  end
end
local owner = redis.call('HGET', KEYS[2], 'owner') or ''
if not redis.call('HGET', KEYS[2], 'bytes') then
  -- Made before bytes were counted: its kept versions are counted now, once, so
  -- the drops below never take off bytes that were never added.
  local sum = 0
  for _, v in ipairs(redis.call('ZRANGE', KEYS[3], 0, -1)) do
    sum = sum + (tonumber(redis.call('HGET', KEYS[3] .. ':' .. v, 'bytes')) or 0)
  end
  redis.call('HSET', KEYS[2], 'bytes', sum)
  redis.call('HINCRBY', KEYS[4], owner, sum)
end
local held = tonumber(redis.call('HGET', KEYS[4], owner)) or 0
local after = held - freed + tonumber(ARGV[4])
local cap = tonumber(ARGV[9])
-- A version that leaves its owner holding less is made even over the cap.
if owner ~= '' and cap > 0 and after > cap and after > held then
  redis.call('HDEL', KEYS[2], 'busy')
  redis.call('HSET', KEYS[2], 'last_used_at', now)
  redis.call('HSET', KEYS[1], 'workspace_note', string.format(ARGV[10], after))
  return 0
end
local n = redis.call('HINCRBY', KEYS[2], 'next_version', 1) - 1
local version = KEYS[3] .. ':' .. n
redis.call('HSET', version, 'manifest', ARGV[3], 'task_id', ARGV[2], 'parent', ARGV[6],
  'bytes', ARGV[4], 'files', ARGV[5], 'created_at', now)
redis.call('ZADD', KEYS[3], now, n)
redis.call('HSET', KEYS[2], 'head', n, 'last_used_at', now)
redis.call('HDEL', KEYS[2], 'busy')
redis.call('HSET', KEYS[1], 'workspace_version', n)
-- A note a refusal wrote earlier (a commit that came late) no longer holds.
redis.call('HDEL', KEYS[1], 'workspace_note')
-- The oldest, as read above: the new version, the newest, ranks last.
for _, old in ipairs(dropped) do
  redis.call('DEL', KEYS[3] .. ':' .. old)
end
if extra > 0 then redis.call('ZREMRANGEBYRANK', KEYS[3], 0, extra - 1) end
redis.call('HINCRBY', KEYS[2], 'bytes', tonumber(ARGV[4]) - freed)
redis.call('HINCRBY', KEYS[4], owner, tonumber(ARGV[4]) - freed)
return n
