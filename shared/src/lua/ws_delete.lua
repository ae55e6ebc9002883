-- WS_DELETE (delete_workspace): a workspace and its versions' records go. Their
-- blobs go later, when the reaper finds nothing else names them. A task still
-- running on it saves nothing (WS_COMMIT finds it gone).
--
-- KEYS[1] workspace hash
-- KEYS[2] its versions (sorted set; a version's hash is this key with ':<n>')
-- KEYS[3] its owner's workspace index   KEYS[4] every workspace
-- KEYS[5] bytes each owner's workspaces hold (hash: owner to the sum of its kept
--         versions' bytes; the admin's under '')
-- ARGV[1] the caller ('' for the admin key, which may delete any)
-- ARGV[2] workspace id
-- ARGV[3] the owner the caller read ('' for the admin's), whose index is the owner's index above
--
-- Returns 1, or 0 when there is no such workspace (or it is another owner's,
-- answered alike).
local owner = redis.call('HGET', KEYS[1], 'owner')
if not owner or (ARGV[1] ~= '' and owner ~= ARGV[1]) or owner ~= ARGV[3] then return 0 end
for _, v in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
  redis.call('DEL', KEYS[2] .. ':' .. v)
end
local bytes = tonumber(redis.call('HGET', KEYS[1], 'bytes')) or 0
if bytes ~= 0 then redis.call('HINCRBY', KEYS[5], owner, -bytes) end
redis.call('DEL', KEYS[1], KEYS[2])
if owner ~= '' then redis.call('ZREM', KEYS[3], ARGV[2]) end
redis.call('ZREM', KEYS[4], ARGV[2])
return 1
