-- WS_FORK (fork_workspace): a new workspace whose first version is a version of
-- another, in O(1): the new version names the same manifest, so no file is
-- copied. The source must be the caller's (the admin may fork any).
--
-- KEYS[1] source workspace hash   KEYS[2] new workspace hash
-- KEYS[3] caller's workspace index (sorted set: workspace id by created_at)
-- KEYS[4] every workspace (sorted set: workspace id by last use)
-- ARGV[1] caller ('' for the admin key: then the caller's index is not touched)
-- ARGV[2] source version ('' for its head)
-- ARGV[3] new workspace id
-- ARGV[4] source workspace id
--
-- A version's hash is the workspace hash with ':versions:<n>' appended, its
-- sorted set of versions with ':versions'.
--
-- Returns the version forked (0: the empty one), or {'refused', why, detail}:
-- 'missing' (no such workspace, or another owner's: answered alike) or
-- 'no_version' (detail: the version asked for).
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
  local first = KEYS[2] .. ':versions:' .. 1
  redis.call('HSET', first, unpack(fields))
  redis.call('HSET', first, 'created_at', now)
  redis.call('HDEL', first, 'parent')
  redis.call('ZADD', KEYS[2] .. ':versions', now, 1)
  new_head = '1'
end
redis.call('HSET', KEYS[2], 'owner', ARGV[1], 'created_at', now, 'last_used_at', now,
  'head', new_head, 'next_version', tonumber(new_head) + 1, 'forked_from', ARGV[4] .. '@' .. v)
if ARGV[1] ~= '' then redis.call('ZADD', KEYS[3], now, ARGV[3]) end
redis.call('ZADD', KEYS[4], now, ARGV[3])
return tonumber(v)
