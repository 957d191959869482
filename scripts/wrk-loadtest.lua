-- wrk script of scripts/loadtest: POSTs a JSON payload with an Idempotency-Key header.
--
-- Environment:
--   LT_BODY  path of the request body (required)
--   LT_PATH  request path (default /webhook)
--   LT_RUN   a run id, so that keys are unique across runs (default: the time)
--   LT_MIX   fraction of requests that repeat a recent key (default 0: every key is new)
--   LT_POOL  how many recent keys a thread repeats from (default 10000)
--
-- At the end, prints one line `WRKJSON {...}` with the totals and latency percentiles (µs).

local threads = {}
local next_id = 0

function setup(thread)
  thread:set("tid", next_id)
  next_id = next_id + 1
  table.insert(threads, thread)
end

local path, run, mix, pool, prefix, suffix
local counter, recent, recent_n = 0, {}, 0
local PLACEHOLDER = "@@IDEMPOTENCY-KEY@@"

function init(args)
  local f = assert(io.open(assert(os.getenv("LT_BODY"), "LT_BODY is not set"), "rb"))
  local body = f:read("*a")
  f:close()
  path = os.getenv("LT_PATH") or "/webhook"
  run = os.getenv("LT_RUN") or tostring(os.time())
  mix = tonumber(os.getenv("LT_MIX") or "0")
  pool = tonumber(os.getenv("LT_POOL") or "10000")
  math.randomseed(os.time() + 7919 * tid)
  -- The request once, split around the key: each request is then one concatenation, so that
  -- wrk spends as little CPU as possible per request (it shares the machine with the server).
  local template = wrk.format("POST", path, {
    ["Host"] = wrk.host,
    ["Content-Type"] = "application/json",
    ["Idempotency-Key"] = PLACEHOLDER,
  }, body)
  local at = assert(string.find(template, PLACEHOLDER, 1, true))
  prefix = string.sub(template, 1, at - 1)
  suffix = string.sub(template, at + #PLACEHOLDER)
end

function request()
  local key
  if recent_n > 0 and mix > 0 and math.random() < mix then
    key = recent[math.random(recent_n)]
  else
    counter = counter + 1
    key = run .. "-" .. tid .. "-" .. counter
    recent[(counter - 1) % pool + 1] = key
    if recent_n < pool then
      recent_n = recent_n + 1
    end
  end
  return prefix .. key .. suffix
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {"requests":%d,"duration_us":%d,"bytes":%d,"errors_connect":%d,"errors_read":%d,' ..
    '"errors_write":%d,"errors_status":%d,"errors_timeout":%d,"p50_us":%d,"p90_us":%d,' ..
    '"p99_us":%d,"max_us":%d,"mean_us":%.1f}\n',
    summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write, e.status,
    e.timeout, latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency.max, latency.mean))
end
