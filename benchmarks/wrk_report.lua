-- wrk script for bench_read.py.
--
-- * Adds "Authorization: <$BENCH_AUTHORIZATION>" to every request (when set).
-- * Counts responses whose status is not 200, per status code, per thread.
-- * At the end prints one line "BENCH_RESULT {json}" with the request count,
--   socket errors by kind, status counts and latency percentiles (microseconds).
--
-- The request itself is static (no request() function), so wrk builds it once.

local authorization = os.getenv("BENCH_AUTHORIZATION")
if authorization ~= nil and authorization ~= "" then
   wrk.headers["Authorization"] = authorization
end

local threads = {}

function setup(thread)
   table.insert(threads, thread)
end

function init(args)
   statuses = {}   -- global of this thread's Lua state; read back in done()
end

function response(status, headers, body)
   if status ~= 200 then
      statuses[status] = (statuses[status] or 0) + 1
   end
end

function done(summary, latency, requests)
   local merged = {}
   for _, thread in ipairs(threads) do
      local counts = thread:get("statuses")
      if counts ~= nil then
         for code, n in pairs(counts) do
            merged[code] = (merged[code] or 0) + n
         end
      end
   end
   local parts = {}
   for code, n in pairs(merged) do
      parts[#parts + 1] = string.format('"%d": %d', code, n)
   end
   local e = summary.errors
   io.write(string.format(
      'BENCH_RESULT {"requests": %d, "duration_us": %d, "bytes": %d, ' ..
      '"errors": {"connect": %d, "read": %d, "write": %d, "status": %d, "timeout": %d}, ' ..
      '"statuses": {%s}, ' ..
      '"latency_us": {"min": %d, "mean": %.1f, "stdev": %.1f, "max": %d, ' ..
      '"p50": %d, "p90": %d, "p95": %d, "p99": %d, "p99.9": %d}}\n',
      summary.requests, summary.duration, summary.bytes,
      e.connect, e.read, e.write, e.status, e.timeout,
      table.concat(parts, ", "),
      latency.min, latency.mean, latency.stdev, latency.max,
      latency:percentile(50), latency:percentile(90), latency:percentile(95),
      latency:percentile(99), latency:percentile(99.9)))
end
