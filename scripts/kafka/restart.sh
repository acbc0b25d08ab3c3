#!/usr/bin/env bash
# restart.sh DIR: starts again, on the same ports and with the same data, a
# broker that start.sh made in DIR and `stop.sh DIR --keep` stopped (a log that
# goes away and comes back, for the tests of what nodes do meanwhile). Waits
# until it is ready, as start.sh does. The broker goes down with the process
# start.sh was told to watch only if that watchdog still runs: pass
# --watch-pid PID again to be sure.
set -euo pipefail
# shellcheck source=lib.sh source-path=SCRIPTDIR
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
dir="${1:?usage: restart.sh DIR [--watch-pid PID] [--timeout S]}"
shift
watch="" timeout=60
while [[ $# -gt 0 ]]; do
  case "$1" in
    --watch-pid) watch="$2"; shift 2 ;;
    --timeout) timeout="$2"; shift 2 ;;
    *) echo "restart.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
[[ -f "$dir/server.properties" ]] || { echo "restart.sh: $dir was not made by start.sh" >&2; exit 1; }
dir="$(cd "$dir" && pwd)"
if [[ -s "$dir/kafka.pid" ]] && pid_runs "$(cat "$dir/kafka.pid")"; then
  echo "restart.sh: the broker of $dir still runs" >&2
  exit 1
fi
port="$(sed -n 's/^advertised.listeners=PLAINTEXT:\/\/127.0.0.1:\([0-9]*\)$/\1/p' "$dir/server.properties")"
libs="$(kafka_libs)"
# shellcheck disable=SC2207
common=($(kafka_jvm_common))
# shellcheck disable=SC2206
java_opts=(${KAFKA_HEAP_OPTS:--Xms128m -Xmx512m} "${common[@]}" ${KAFKA_JVM_OPTS:-}
  -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -Djava.awt.headless=true
  -Dlog4j2.configurationFile="$dir/log4j2.properties")
started_before="$(grep -c 'Kafka Server started' "$dir/server.log" 2>/dev/null || true)"
bash -c 'echo $$ >"$1"; shift; exec "$@"' _ "$dir/kafka.pid" \
  java "${java_opts[@]}" -cp "$libs/*" kafka.Kafka "$dir/server.properties" \
  </dev/null >>"$dir/kafka.out" 2>&1 &
for _ in $(seq 100); do [[ -s "$dir/kafka.pid" ]] && break; sleep 0.02; done
pid="$(cat "$dir/kafka.pid")"
deadline=$((SECONDS + timeout))
until [[ "$(grep -c 'Kafka Server started' "$dir/server.log" 2>/dev/null || true)" -gt "${started_before:-0}" ]] \
    && (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do
  if ! kill -0 "$pid" 2>/dev/null; then
    tail -n 30 "$dir/server.log" >&2 || true
    # What the JVM said on its way out (a port or the data folder's lock taken).
    echo "restart.sh: the broker's output (kafka.out):" >&2
    tail -n 30 "$dir/kafka.out" >&2 || true
    echo "restart.sh: the broker exited during startup" >&2
    exit 1
  fi
  ((SECONDS < deadline)) || { echo "restart.sh: not ready after ${timeout}s" >&2; exit 1; }
  sleep 0.1
done
if [[ -n "$watch" ]]; then
  # shellcheck disable=SC2016
  nohup bash -c '
    watch=$1 pid=$2
    while kill -0 "$watch" 2>/dev/null && kill -0 "$pid" 2>/dev/null; do sleep 1; done
    kill "$pid" 2>/dev/null
  ' _ "$watch" "$pid" </dev/null >/dev/null 2>&1 &
fi
echo "BOOTSTRAP=127.0.0.1:$port"
echo "PID=$pid"
echo "DIR=$dir"
