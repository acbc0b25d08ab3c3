#!/usr/bin/env bash
# What the per-client limits cost on the poll path, in instructions (callgrind:
# noise-immune on a shared machine). The same binary three times through
# benches/poll/callgrind.sh (one worker, 32,000 GETs of one box pipelined 16
# deep from one connection), each with its config:
#   off      the embedded default: every per-client limit 0;
#   on       every limit on, set so none refuses (the client is the peer);
#   proxied  the same limits, the client named by a PROXY v2 header from a
#            trusted proxy (how deploy/haproxy reaches the nodes).
# Then the inclusive instructions per request of the loop (Worker::run), the
# request path (Connection::serve) and the admission step (Admission::admit).
#
#   benches/limits/callgrind.sh [REQUESTS=32000] [DEPTH=16]
#   POLLBOX_BIN=path/to/pollbox benches/limits/callgrind.sh   # a binary built elsewhere
set -euo pipefail
cd "$(dirname "$0")/../.."
out=$(mktemp -d)
limits='[limits]
max_connections_per_ip = 1000
max_streams_per_ip = 1000
requests_per_s_per_ip = 1000000
requests_burst_per_ip = 1000000'
: >"$out/off.toml"
printf '%s\n' "$limits" >"$out/on.toml"
printf '[server]\ntrusted_proxies = ["127.0.0.1"]\n%s\n' "$limits" >"$out/proxied.toml"
for run in off on proxied; do
  client=""
  [ "$run" = proxied ] && client=203.0.113.7
  echo "== $run"
  POLLBOX_CONFIG="$out/$run.toml" PROXY_V2_CLIENT=$client PORT=${PORT:-18651} \
    POLL_FUNCTIONS="Worker::run|Connection::serve|Service::answer|Admission::admit|Client::take_request" \
    POLL_DECIMALS=1 POLL_PROFILE="$out/$run.out" \
    benches/poll/callgrind.sh "$@" | grep -v "^raw profile:"
done
echo "raw profiles: $out"
