-- wrk script for scripts/bench/bench.py: POSTs one MCP JSON-RPC request per
-- call to /mcp (or GETs /healthz), and writes wrk's figures as JSON.
--
-- Environment (set by bench.py):
--   BENCH_OUT       file the JSON summary is written to (required)
--   BENCH_TOKEN     bearer token; unset for an open endpoint (GET /healthz)
--   BENCH_BODY      a fixed request body (sent as is on every request), or
--   BENCH_TEMPLATE  a body in which "{ID}" is replaced, per request, by a line
--                   picked at random from the file BENCH_IDS (task ids)
--
-- A fixed body keeps wrk's own cost per request minimal (the request is
-- formatted once); the template costs one string substitution per request.

local token = os.getenv("BENCH_TOKEN")
local body = os.getenv("BENCH_BODY")
local template = os.getenv("BENCH_TEMPLATE")
local ids_file = os.getenv("BENCH_IDS")

if token then
  wrk.headers["Authorization"] = "Bearer " .. token
end
if body or template then
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
  -- rmcp's Streamable HTTP server refuses a POST that does not accept both.
  wrk.headers["Accept"] = "application/json, text/event-stream"
  wrk.body = body
end

if template then
  local ids = {}
  for line in io.lines(ids_file) do
    if line ~= "" then ids[#ids + 1] = line end
  end
  assert(#ids > 0, "BENCH_IDS lists no id")
  local before, after = template:match("^(.*){ID}(.*)$")
  assert(before, "BENCH_TEMPLATE has no {ID}")

  function init(args)
    -- A different sequence per thread.
    math.randomseed(os.time() + tonumber(tostring({}):match("0x(%x+)") or "0", 16) % 100000)
  end

  function request()
    return wrk.format(nil, nil, nil, before .. ids[math.random(#ids)] .. after)
  end
end

function done(summary, latency, requests)
  local e = summary.errors
  local f = assert(io.open(os.getenv("BENCH_OUT"), "w"))
  f:write(string.format(
    '{"requests":%d,"duration_us":%d,"bytes":%d,' ..
    '"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d},' ..
    '"latency_us":{"min":%d,"mean":%.1f,"p50":%d,"p90":%d,"p99":%d,"max":%d}}\n',
    summary.requests, summary.duration, summary.bytes,
    e.connect, e.read, e.write, e.status, e.timeout,
    latency.min, latency.mean, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), latency.max))
  f:close()
end
