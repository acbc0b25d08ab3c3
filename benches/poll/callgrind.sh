#!/usr/bin/env bash
# Instruction counts of the server's poll path (noise-immune on a shared machine):
# pollbox under callgrind, 32,000 GETs pipelined 16 deep from a Python client,
# then the inclusive cost of the request path per request.
#
#   benches/poll/callgrind.sh [REQUESTS=32000] [DEPTH=16]
#   POLLBOX_BIN=path/to/pollbox benches/poll/callgrind.sh ...   # a binary built
#       elsewhere (e.g. main's, for a before/after), instead of building this tree
#   POLLBOX_CONFIG=file.toml POLL_HEADER="Authorization: Bearer ..." benches/poll/callgrind.sh
#       a config of its own, and one more header on every request (benches/auth-poll/)
#   PROXY_V2_CLIENT=203.0.113.7 benches/poll/callgrind.sh   # the connection opens
#       with a PROXY v2 header naming that client (pipelined_client.py)
#   POLL_FUNCTIONS="Worker::run|Connection::serve" POLL_DECIMALS=1 POLL_PROFILE=x.out
#       other functions to list, per-request figures to one decimal, and where the
#       profile goes (benches/limits/callgrind.sh)
# Worker::run is the whole loop (reads, writes, epoll) per request; the rest is
# the request path inside it (names before and after the 2026-11-22 redesign,
# so older builds' results list too). WorkerHost::finish is the request-duration
# clock read and histogram, once per read, outside Connection::serve.
set -euo pipefail
cd "$(dirname "$0")/../.."
n=${1:-32000}
depth=${2:-16}
bin=${POLLBOX_BIN:-target/release/pollbox}
if [ -z "${POLLBOX_BIN:-}" ]; then
  cargo build --release -q -p pollbox
fi
command -v valgrind >/dev/null || { apt-get update -qq && apt-get install -y -qq valgrind; }
functions=${POLL_FUNCTIONS:-"Worker::run|Access::grant|Service::check_access|Access::presented|Connection::received|Worker::serve|dispatch::handle|write_answer|Connection>?::serve|Service::answer|Framer::advance|Heads::write|BoxTable::poll|BoxTable::version|BuildHasher::hash_one|WorkerHost::finish"}
decimals=${POLL_DECIMALS:-0}
profile=${POLL_PROFILE:-$(mktemp -d)/cg.out}
port=${PORT:-18650}
valgrind --tool=callgrind --callgrind-out-file="$profile" \
  "$bin" serve ${POLLBOX_CONFIG:+--config "$POLLBOX_CONFIG"} --listen 127.0.0.1:$port --workers 1 2>"${profile%.out}.vg" &
vg=$!
sleep 4
python3 benches/poll/pipelined_client.py $port "$n" "$depth"
kill -INT $vg
wait $vg || true
# Annotated from the profile's directory: file names stay absolute, so each
# function is one line (from the repository root, inlined parts of one function
# are split between relative and absolute names).
(cd "$(dirname "$profile")" && callgrind_annotate --inclusive=yes "$(basename "$profile")" 2>/dev/null) |
  grep -E "($functions) \[" |
  awk -v n="$n" -v d="$decimals" '{c = $1; gsub(",", "", c); f = $0; sub(/^ *[0-9,]+ +\( *[0-9.]+%\) +/, "", f); sub(/ \[.*$/, "", f); printf "%8." d "f instructions/request  %s\n", c / n, f}'
echo "raw profile: $profile"
