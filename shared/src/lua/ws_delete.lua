-- WS_DELETE (delete_workspace, and the api's idle expiry): a workspace and its
-- versions' records go. Their blobs stay in the store until a sweep (WS_SWEEP). A task
-- still running on it saves nothing (WS_COMMIT finds it gone).
--
-- KEYS[1] workspace hash
-- KEYS[2] its versions (sorted set; a version's hash is this key with ':<n>')
-- KEYS[3] its owner's workspace index   KEYS[4] every workspace
-- KEYS[5] bytes each owner's workspaces hold (hash: owner to the sum of its kept
--         versions' bytes; the admin's under '')
-- KEYS[6] for an expiry, the task record its busy field named when the caller
--         read it (any key when none)
-- ARGV[1] the caller ('' for the admin key, which may delete any)
-- ARGV[2] workspace id
-- ARGV[3] the owner the caller read ('' for the admin's), whose index is the owner's index above
-- ARGV[4] for an expiry, the idle horizon in ms: it goes only if last used before
--         it ('' to delete it now, as asked)
-- ARGV[5] for an expiry, the busy task the caller read ('' for none)
-- ARGV[6] the save grace in ms (as SUBMIT's): a task that ended this
--         recently, on a worker not lost, may still be saving into the workspace
--
-- An expiry leaves a workspace that was used since the caller looked (and scores
-- it in KEYS[4] by that use), whose busy task changed, or whose busy task is
-- still queued or running, or still saving (SUBMIT's rule).
--
-- Returns 1, or 0 when there is no such workspace (or it is another owner's,
-- answered alike), or an expiry left it.
local owner = redis.call('HGET', KEYS[1], 'owner')
if not owner or (ARGV[1] ~= '' and owner ~= ARGV[1]) or owner ~= ARGV[3] then return 0 end
if ARGV[4] ~= '' then
  local used, busy = unpack(redis.call('HMGET', KEYS[1], 'last_used_at', 'busy'))
  if (tonumber(used) or 0) >= tonumber(ARGV[4]) then
    -- Used since its index entry was scored: scored again, so the next pass
    -- looks at the idle ones first.
    redis.call('ZADD', KEYS[4], 'XX', used, ARGV[2])
    return 0
  end
  if (busy or '') ~= ARGV[5] then return 0 end
  if ARGV[5] ~= '' then
    local st, fin, worker, kind =
      unpack(redis.call('HMGET', KEYS[6], 'state', 'finished_at', 'worker', 'reason_kind'))
    if st == 'queued' or st == 'running' then return 0 end
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    local saving = st and worker and worker ~= '' and kind ~= 'worker-lost'
      and kind ~= 'spec-rejected' and tonumber(fin or '0') > now - tonumber(ARGV[6])
    if saving then return 0 end
  end
end
for _, v in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
  redis.call('DEL', KEYS[2] .. ':' .. v)
end
local bytes = tonumber(redis.call('HGET', KEYS[1], 'bytes')) or 0
if bytes ~= 0 then redis.call('HINCRBY', KEYS[5], owner, -bytes) end
redis.call('DEL', KEYS[1], KEYS[2])
if owner ~= '' then redis.call('ZREM', KEYS[3], ARGV[2]) end
redis.call('ZREM', KEYS[4], ARGV[2])
return 1
