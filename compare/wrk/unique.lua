-- The first-deliveries mix of `compare/run`: every request carries a delivery id never sent
-- before, so every request is processed.
--
-- Ids are `<run>-<thread>-<n>`. wrk never seeds Lua's random generator, so two wrk processes
-- would otherwise send the same ids, and a measured run after a warm-up would start with
-- duplicates. The run id comes from WRK_RUN (compare/run sets a different one for every wrk
-- process), else from /dev/urandom, else from the clock.

local function run_id()
  local run = os.getenv("WRK_RUN")
  if run and run ~= "" then
    return run
  end
  local f = io.open("/dev/urandom", "rb")
  if f then
    local bytes = f:read(8)
    f:close()
    if bytes then
      return (bytes:gsub(".", function(c) return string.format("%02x", c:byte()) end))
    end
  end
  math.randomseed(os.time() + math.floor(os.clock() * 1e6))
  return string.format("%d-%d", os.time(), math.random(1, 1e9))
end

local run = run_id()

-- setup runs once per thread in the main Lua state: give each thread its own number.
local threads = 0
function setup(thread)
  thread:set("tid", threads)
  threads = threads + 1
end

-- The rest runs in each thread's own Lua state.
local head, tail
local n = 0

function init(args)
  -- Format the request once around a marker and splice each id in: cheaper for wrk than
  -- wrk.format per request, and the Content-Length (of the body `{}`) never changes.
  local marker = "\1ID\1"
  local req = wrk.format("POST", "/webhooks/kalipto", {
    ["Content-Type"] = "application/json",
    ["X-Kalipto-Delivery-Id"] = marker,
  }, "{}")
  local at = req:find(marker, 1, true)
  head = req:sub(1, at - 1)
  tail = req:sub(at + #marker)
  head = head .. run .. "-" .. tostring(tid or 0) .. "-"
end

function request()
  n = n + 1
  return head .. n .. tail
end
