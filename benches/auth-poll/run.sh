#!/usr/bin/env bash
# A keep-alive poll with a token against a public poll (docs/private-boxes.md:
# a token is verified once per connection, then compared): side by side in one
# run, two ways.
#
#   benches/auth-poll/run.sh [DURATION_S=10] [ROUNDS=3]
#
# 1. CPU: each server alone on core 0 (one worker), wrk on core 1 with 32
#    connections pipelining 16 polls deep (benches/side-by-side/pipeline.lua) for
#    DURATION s; the server's user+system CPU (from /proc/PID/stat) per answer,
#    rounds alternating public / token so drift hits both alike.
# 2. Instructions (callgrind, noise-immune): benches/poll/callgrind.sh for each,
#    32,000 polls 16 deep.
#
# The token is an ES256 JWT minted by PyJWT (crates/server/tests/mint_jwt.py),
# read and write "lg-*", an hour to live: 260-odd bytes more on every
# request, which the framer reads; that is part of what a token costs.
# POLLBOX_BIN=path uses a binary built elsewhere.
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=${1:-10}
rounds=${2:-3}
bin=${POLLBOX_BIN:-target/release/pollbox}
if [ -z "${POLLBOX_BIN:-}" ]; then
  cargo build --release -q -p pollbox
fi
command -v wrk >/dev/null || { apt-get update -qq && apt-get install -y -qq wrk; }
python3 -c "import jwt, cryptography" 2>/dev/null || python3 -m pip install --quiet pyjwt cryptography
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
python3 crates/server/tests/mint_jwt.py keys "$dir" >/dev/null
exp=$(($(date +%s) + 3600))
token=$(echo "[{\"kid\":\"es\",\"claims\":{\"exp\":$exp,\"pollbox\":{\"read\":[\"lg-*\",\"k\"],\"write\":[\"lg-*\",\"k\"]}}}]" |
  python3 crates/server/tests/mint_jwt.py mint "$dir")
printf '[auth]\nread = "token"\n[auth.jwt]\nkeys_file = "%s/jwks.json"\n' "$dir" >"$dir/token.toml"
printf '' >"$dir/public.toml"
port=18660

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

one() { # public|token -> prints "µs CPU per answer (answers/s)"
  local cfg=$dir/$1.toml header=""
  [ "$1" = token ] && header="Authorization: Bearer $token"
  taskset -c 0 "$bin" serve --config "$cfg" --listen 127.0.0.1:$port --workers 1 2>"$dir/$1.log" &
  local pid=$!
  for _ in $(seq 50); do
    curl -s -o /dev/null "http://127.0.0.1:$port/healthz" && break
    sleep 0.1
  done
  for i in $(seq 0 15); do
    curl -s -o /dev/null ${header:+-H "$header"} --data "{\"v\":$i}" "http://127.0.0.1:$port/v1/boxes/lg-$i"
  done
  local before
  before=$(cpu_ticks $pid)
  taskset -c 1 wrk -t1 -c32 -d"${secs}s" ${header:+-H "$header"} -s benches/side-by-side/pipeline.lua \
    "http://127.0.0.1:$port" -- 16 >"$dir/wrk.txt"
  local after
  after=$(cpu_ticks $pid)
  local answers non2xx
  answers=$(awk '/requests in/ { print $1 }' "$dir/wrk.txt")
  non2xx=$(awk '/Non-2xx/ { print $NF }' "$dir/wrk.txt")
  [ -z "$non2xx" ] || { echo "$1: $non2xx answers not 2xx" >&2; cat "$dir/wrk.txt" >&2; }
  kill -INT $pid
  wait $pid || true
  local hz
  hz=$(getconf CLK_TCK)
  awk -v t=$((after - before)) -v hz="$hz" -v n="$answers" -v s="$secs" \
    'BEGIN { printf "%.3f µs (%.0f answers/s)", t / hz * 1e6 / n, n / s }'
}

echo "== server CPU per answer, wrk -t1 -c32 pipelining 16 deep for ${secs}s, server on core 0, wrk on core 1"
pub_sum=0
tok_sum=0
for r in $(seq "$rounds"); do
  p=$(one public)
  t=$(one token)
  echo "round $r: public $p  token $t  ratio $(awk -v p="${p%% *}" -v t="${t%% *}" 'BEGIN { printf "%.3f", t / p }')"
  pub_sum=$(awk -v a="$pub_sum" -v b="${p%% *}" 'BEGIN { print a + b }')
  tok_sum=$(awk -v a="$tok_sum" -v b="${t%% *}" 'BEGIN { print a + b }')
done
awk -v p="$pub_sum" -v t="$tok_sum" 'BEGIN { printf "all rounds: token / public = %.3f\n", t / p }'

echo "== instructions per request (callgrind, 32,000 polls 16 deep)"
echo "-- public"
POLLBOX_BIN=$bin POLLBOX_CONFIG=$dir/public.toml benches/poll/callgrind.sh 32000 16 | grep -v "raw profile"
echo "-- token"
POLLBOX_BIN=$bin POLLBOX_CONFIG=$dir/token.toml POLL_HEADER="Authorization: Bearer $token" \
  benches/poll/callgrind.sh 32000 16 | grep -v "raw profile"
