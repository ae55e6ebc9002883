-- WS_SWEEP: the blob store's sweep, one worker at a time, fenced against saves.
-- A sweep deletes blobs and manifests no kept version names. A save that checked
-- a blob before a delete phase may name one the phase deletes, so each delete
-- phase counts the epoch up, and WS_COMMIT refuses a version whose save began in
-- another epoch (the worker checks its blobs again and retries). A save begins
-- only outside a delete phase ('look'), and a fork counts 'forks' up (WS_FORK),
-- so a sweep that saw a fork while it read what is named deletes nothing.
--
-- KEYS[1] the sweep (hash: epoch, forks, holder, phase, until, began)
-- ARGV[1] what to do:
--         'look'   (a save begins) the epoch, unless a delete phase is under way;
--         'begin'  (a sweep starts listing) the sweep is this worker's, unless
--                  another's lease runs;
--         'delete' (its delete phase starts) the epoch counted up;
--         'renew'  the lease extended, between batches of deletes;
--         'end'    the sweep is over, the lease given up
-- ARGV[2] the sweeping worker's name ('' for 'look')
-- ARGV[3] the lease, in ms, from now ('' for 'look' and 'end'): a worker that
--         dies sweeping holds the sweep no longer than this
-- ARGV[4] ('begin' only) how often the store is swept, in ms: a sweep that began
--         within this long makes another needless (one that failed included: the
--         next is tried an interval later)
--
-- Returns, for 'look', the epoch; for 'begin', 'delete' and 'renew', the forks
-- made so far; for 'end', 1. Or {'refused', why, detail}: 'sweeping' (look: a
-- delete phase runs; detail: its ms left), 'sweep_held' (begin: another worker
-- sweeps; detail: its name), 'swept' (begin: a sweep began within ARGV[4];
-- detail: how many ms ago) or 'sweep_lost' (delete, renew, end: the lease ran
-- out, or another took the sweep).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local epoch, forks, holder, phase, till, began =
  unpack(redis.call('HMGET', KEYS[1], 'epoch', 'forks', 'holder', 'phase', 'until', 'began'))
local live = holder and (tonumber(till) or 0) > now
local op = ARGV[1]
if op == 'look' then
  if live and phase == 'deleting' then
    return {'refused', 'sweeping', string.format('%d', tonumber(till) - now)}
  end
  return tonumber(epoch) or 0
end
local lease = string.format('%d', now + (tonumber(ARGV[3]) or 0))
if op == 'begin' then
  if live and holder ~= ARGV[2] then return {'refused', 'sweep_held', holder} end
  local since = now - (tonumber(began) or 0)
  if since < (tonumber(ARGV[4]) or 0) then
    return {'refused', 'swept', string.format('%d', since)}
  end
  redis.call('HSET', KEYS[1], 'holder', ARGV[2], 'phase', 'listing', 'until', lease,
    'began', string.format('%d', now))
  return tonumber(forks) or 0
end
if not live or holder ~= ARGV[2] then return {'refused', 'sweep_lost', ''} end
if op == 'delete' then
  redis.call('HINCRBY', KEYS[1], 'epoch', 1)
  redis.call('HSET', KEYS[1], 'phase', 'deleting', 'until', lease)
  return tonumber(forks) or 0
end
if op == 'renew' then
  redis.call('HSET', KEYS[1], 'until', lease)
  return tonumber(forks) or 0
end
redis.call('HDEL', KEYS[1], 'holder', 'phase', 'until')
return 1
