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
--
-- Refuses, writing nothing, when the task is not this worker's, or the workspace
-- is gone (deleted) or busy with another task (this one ended longer than the
-- save grace ago, and the next took the workspace).
--
-- Returns the new version's number, 0 when none was made, or {'refused', why}:
-- 'not_yours' or 'not_busy'.
local worker = redis.call('HGET', KEYS[1], 'worker')
if worker ~= ARGV[1] then return {'refused', 'not_yours'} end
if redis.call('HGET', KEYS[2], 'busy') ~= ARGV[2] then
  redis.call('HSET', KEYS[1], 'workspace_note', ARGV[8])
  return {'refused', 'not_busy'}
end
local t = redis.call('TIME')
local now = string.format('%d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
if ARGV[3] == '' then
  redis.call('HDEL', KEYS[2], 'busy')
  redis.call('HSET', KEYS[2], 'last_used_at', now)
  redis.call('HSET', KEYS[1], 'workspace_note', ARGV[8])
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
local keep = tonumber(ARGV[7])
local extra = redis.call('ZCARD', KEYS[3]) - keep
if extra > 0 then
  for _, old in ipairs(redis.call('ZRANGE', KEYS[3], 0, extra - 1)) do
    redis.call('DEL', KEYS[3] .. ':' .. old)
  end
  redis.call('ZREMRANGEBYRANK', KEYS[3], 0, extra - 1)
end
return n
