#!/usr/bin/env bash
# Does `pollbox load` out-drive wrk? Server pinned to core 0, each generator in
# turn pinned to core 1, same connections, same target (a poll of one box),
# closed loop, alternating runs so drift hits both. Prints a markdown table.
#
#   benches/load-vs-wrk/run.sh [SECONDS=10] [CONNECTIONS=32] [ROUNDS=2]
#
# Needs wrk (apt-get install -y wrk).
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=${1:-10}
conns=${2:-32}
rounds=${3:-2}
command -v wrk >/dev/null || { echo "needs wrk: apt-get install -y wrk" >&2; exit 2; }
cargo build --release -q -p pollbox
bin=target/release/pollbox
port=18080
taskset -c 0 "$bin" serve --listen 127.0.0.1:$port --workers 1 2>/dev/null &
srv=$!
trap 'kill $srv 2>/dev/null; wait $srv 2>/dev/null' EXIT
sleep 0.5
url=http://127.0.0.1:$port
curl -s -X POST "$url/v1/boxes/lg-0" -d '{"value":1,"player":"p-1"}' >/dev/null

echo "| round | generator | req/s |"
echo "|---|---|---|"
for r in $(seq 1 "$rounds"); do
  w=$(taskset -c 1 wrk -t1 -c"$conns" -d"${secs}s" "$url/v1/boxes/lg-0" | awk '/Requests\/sec/ {print $2}')
  echo "| $r | wrk -t1 -c$conns | $w |"
  p=$(taskset -c 1 "$bin" load --url "$url" --connections "$conns" --threads 1 \
        --duration "${secs}s" --mix poll:100 --keys 1 --quiet --json /tmp/pollbox-load.json >/dev/null;
      python3 -c 'import json;print(round(json.load(open("/tmp/pollbox-load.json"))["achieved_rate"]))')
  echo "| $r | pollbox load -t1 -c$conns | $p |"
done
echo
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
