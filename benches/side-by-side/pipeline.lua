-- wrk script: every write carries DEPTH pipelined GETs (default 16) for the
-- pre-seeded boxes lg-0 .. lg-(DEPTH-1); wrk counts each answer as one request.
-- Usage: wrk -t1 -c32 -d10s -s benches/side-by-side/pipeline.lua http://127.0.0.1:PORT -- 16
init = function(args)
   local depth = tonumber(args[1]) or 16
   local r = {}
   for i = 1, depth do
      r[i] = wrk.format("GET", "/v1/boxes/lg-" .. (i - 1))
   end
   req = table.concat(r)
end

request = function()
   return req
end
