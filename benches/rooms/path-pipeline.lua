-- wrk script: every write carries DEPTH pipelined GETs of one PATH (default
-- 16); wrk counts each answer as one request.
-- Usage: wrk -t1 -c32 -d8s -s benches/rooms/path-pipeline.lua http://127.0.0.1:PORT -- /v1/boxes/a 16
init = function(args)
   local path = args[1] or "/"
   local depth = tonumber(args[2]) or 16
   local r = {}
   for i = 1, depth do
      r[i] = wrk.format("GET", path)
   end
   req = table.concat(r)
end

request = function()
   return req
end
