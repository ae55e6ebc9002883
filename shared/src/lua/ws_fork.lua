-- WS_FORK (fork_workspace): a new workspace whose first version is a version of
-- another, in O(1): the new version names the same manifest, so no file is
-- copied. The source must be the caller's (the admin may fork any).
--
-- KEYS[1] source workspace hash   KEYS[2] new workspace hash
-- KEYS[3] caller's workspace index (sorted set: workspace id by created_at)
-- KEYS[4] every workspace (sorted set: workspace id by last use)
-- KEYS[5] bytes each owner's workspaces hold (hash: owner to the sum of its kept
--         versions' bytes; the admin's under '')
-- KEYS[6] the blob store's sweep (hash; see WS_SWEEP): its 'forks' counted up,
--         so a sweep reading what versions name while this runs deletes nothing
-- ARGV[1] caller ('' for the admin key: then the caller's index is not touched)
-- ARGV[2] source version ('' for its head)
-- ARGV[3] new workspace id
-- ARGV[4] source workspace id
-- ARGV[5] the most bytes an owner's kept versions may hold together (0: no cap;
--         the admin's are not capped)
--
-- A version's hash is the workspace hash with ':versions:<n>' appended, its
-- sorted set of versions with ':versions'.
--
-- Returns the version forked (0: the empty one), or {'refused', why, detail}:
-- 'missing' (no such workspace, or another owner's: answered alike),
-- 'no_version' (detail: the version asked for) or 'over_cap' (detail: the
-- bytes the caller's versions would hold).
local src_owner, head = unpack(redis.call('HMGET', KEYS[1], 'owner', 'head'))
if not src_owner or (ARGV[1] ~= '' and src_owner ~= ARGV[1]) then
  return {'refused', 'missing', ARGV[4]}
end
local v = ARGV[2]
if v == '' then v = head end
local t = redis.call('TIME')
local now = string.format('%d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
local new_head = '0'
if v ~= '0' then
  local fields = redis.call('HGETALL', KEYS[1] .. ':versions:' .. v)
  if #fields == 0 then return {'refused', 'no_version', v} end
  local bytes = 0
  for i = 1, #fields, 2 do
    if fields[i] == 'bytes' then bytes = tonumber(fields[i + 1]) or 0 end
  end
  local after = (tonumber(redis.call('HGET', KEYS[5], ARGV[1])) or 0) + bytes
  local cap = tonumber(ARGV[5])
  if ARGV[1] ~= '' and cap > 0 and after > cap then
    return {'refused', 'over_cap', string.format('%d', after)}
  end
  redis.call('HINCRBY', KEYS[5], ARGV[1], bytes)
  redis.call('HSET', KEYS[2], 'bytes', bytes)
  local first = KEYS[2] .. ':versions:' .. 1
  redis.call('HSET', first, unpack(fields))
  redis.call('HSET', first, 'created_at', now)
  redis.call('HDEL', first, 'parent')
  redis.call('ZADD', KEYS[2] .. ':versions', now, 1)
  redis.call('HINCRBY', KEYS[6], 'forks', 1)
  new_head = '1'
end
redis.call('HSET', KEYS[2], 'owner', ARGV[1], 'created_at', now, 'last_used_at', now,
  'head', new_head, 'next_version', tonumber(new_head) + 1, 'forked_from', ARGV[4] .. '@' .. v)
if ARGV[1] ~= '' then redis.call('ZADD', KEYS[3], now, ARGV[3]) end
redis.call('ZADD', KEYS[4], now, ARGV[3])
return tonumber(v)
