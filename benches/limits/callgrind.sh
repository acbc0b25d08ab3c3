#!/usr/bin/env bash
# What the per-client limits cost on the poll path, in instructions (callgrind:
# noise-immune on a shared machine). The same binary three times, each under
# callgrind with one worker, 32,000 GETs of one box pipelined 16 deep from one
# connection (benches/poll/pipelined_client.py):
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
n=${1:-32000}
depth=${2:-16}
bin=${POLLBOX_BIN:-target/release/pollbox}
if [ -z "${POLLBOX_BIN:-}" ]; then
  cargo build --release -q -p pollbox
fi
command -v valgrind >/dev/null || { apt-get update -qq && apt-get install -y -qq valgrind; }
out=$(mktemp -d)
port=${PORT:-18651}
limits='[limits]
max_connections_per_ip = 1000
max_streams_per_ip = 1000
requests_per_s_per_ip = 1000000
requests_burst_per_ip = 1000000'
: >"$out/off.toml"
printf '%s\n' "$limits" >"$out/on.toml"
printf '[server]\ntrusted_proxies = ["127.0.0.1"]\n%s\n' "$limits" >"$out/proxied.toml"
for run in off on proxied; do
  valgrind --tool=callgrind --callgrind-out-file="$out/$run.out" \
    "$bin" serve --config "$out/$run.toml" --listen 127.0.0.1:$port --workers 1 2>"$out/$run.vg" &
  vg=$!
  sleep 4
  client=""
  [ "$run" = proxied ] && client=203.0.113.7
  PROXY_V2_CLIENT=$client python3 benches/poll/pipelined_client.py $port "$n" "$depth"
  kill -INT $vg
  wait $vg || true
  echo "== $run"
  # Annotated from the profile's directory: one line per function.
  (cd "$out" && callgrind_annotate --inclusive=yes "$run.out" 2>/dev/null) |
    grep -E "Worker::run \[|Connection::serve \[|Service::answer \[|Admission::admit \[|Client::take_request \[" |
    awk -v n="$n" '{c = $1; gsub(",", "", c); f = $0; sub(/^ *[0-9,]+ +\( *[0-9.]+%\) +/, "", f); sub(/ \[.*$/, "", f); printf "%8.1f instructions/request  %s\n", c / n, f}'
done
echo "raw profiles: $out"
