-- The duplicates mix of `compare/run`: every request carries one of 100 delivery ids
-- (`dup-1` .. `dup-100`), so after the first hundred requests every request is a duplicate of
-- a delivery already processed. compare/run warms each receiver up with this mix, so in the
-- measured run all of them are.

local requests = {}

function init(args)
  for i = 1, 100 do
    requests[i] = wrk.format("POST", "/webhooks/kalipto", {
      ["Content-Type"] = "application/json",
      ["X-Kalipto-Delivery-Id"] = "dup-" .. i,
    }, "{}")
  end
end

function request()
  return requests[math.random(1, 100)]
end
