#!/usr/bin/env bash
# broker.sh DIR N ACTION: acts on broker N (1-based) of a cluster that
# `start.sh --brokers M` made in DIR (its files are in DIR/bN).
#   kill            SIGKILL (kill -9); returns once it is gone
#   pause | resume  SIGSTOP | SIGCONT (a hung broker: its sessions time out)
#   term            SIGTERM (a controlled shutdown: leaders move away first);
#                   returns once it has exited (SIGKILL after KAFKA_STOP_TIMEOUT=120 s, exit 1)
#   start           starts it again with its config, data and ports; returns
#                   once it serves requests (KAFKA_START_TIMEOUT=90 s)
#   pid | port      prints its java pid (exit 1 if it does not run) | client port
#   wait-isr TOPIC  returns once every partition of TOPIC has a leader and its
#                   full ISR (all its replicas in sync): after a start, before
#                   the next broker of a rolling restart (KAFKA_ISR_TIMEOUT=120 s)
set -euo pipefail
# shellcheck source=lib.sh source-path=SCRIPTDIR
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
usage() { sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
[[ $# -ge 3 ]] || usage
dir="$1" n="$2" action="$3"
shift 3
b="$dir/b$n"
[[ "$n" =~ ^[0-9]+$ && -f "$b/server.properties" ]] \
  || { echo "broker.sh: no broker $n in $dir (not made by start.sh --brokers)" >&2; exit 1; }
b="$(cd "$b" && pwd)"

# The broker's pid if it runs (its pid file, checked against its command line).
running_pid() {
  local pid
  pid="$(cat "$b/kafka.pid" 2>/dev/null)" || return 1
  [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null \
    && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF "$b/server.properties" \
    && echo "$pid"
}
need_pid() {
  running_pid || { echo "broker.sh: broker $n of $dir does not run" >&2; exit 1; }
}
wait_gone() { # PID SECONDS: 0 once PID is gone, 1 if it is still there
  local _
  for _ in $(seq $(($2 * 10))); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.1; done
  ! kill -0 "$1" 2>/dev/null
}
port="$(sed -n 's#^advertised.listeners=PLAINTEXT://127.0.0.1:\([0-9]*\)$#\1#p' "$b/server.properties")"

case "$action" in
  kill)
    pid="$(need_pid)"
    kill -9 "$pid"
    wait_gone "$pid" 10 ;;
  pause) pid="$(need_pid)"; kill -STOP "$pid" ;;
  resume) pid="$(need_pid)"; kill -CONT "$pid" ;;
  term)
    pid="$(need_pid)"
    kill -CONT "$pid" 2>/dev/null || true
    kill "$pid"
    t="${KAFKA_STOP_TIMEOUT:-120}"
    if ! wait_gone "$pid" "$t"; then
      echo "broker.sh: broker $n ($pid) did not stop in $t s; killing it" >&2
      kill -9 "$pid" 2>/dev/null || true
      wait_gone "$pid" 10 || true
      exit 1
    fi ;;
  start)
    if pid="$(running_pid)"; then echo "broker.sh: broker $n of $dir still runs ($pid)" >&2; exit 1; fi
    [[ -s "$b/java.cmd" ]] || { echo "broker.sh: no $b/java.cmd" >&2; exit 1; }
    mapfile -d '' cmd <"$b/java.cmd"
    started_before="$(grep -c 'Kafka Server started' "$b/server.log" 2>/dev/null || true)"
    rm -f "$b/kafka.pid"
    bash -c 'echo $$ >"$1"; shift; exec "$@"' _ "$b/kafka.pid" "${cmd[@]}" \
      </dev/null >>"$b/kafka.out" 2>&1 &
    for _ in $(seq 100); do [[ -s "$b/kafka.pid" ]] && break; sleep 0.02; done
    pid="$(cat "$b/kafka.pid")"
    deadline=$((SECONDS + ${KAFKA_START_TIMEOUT:-90}))
    until [[ "$(grep -c 'Kafka Server started' "$b/server.log" 2>/dev/null || true)" -gt "${started_before:-0}" ]] \
        && (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do
      if ! kill -0 "$pid" 2>/dev/null; then
        tail -n 30 "$b/server.log" >&2 || true
        echo "broker.sh: broker $n exited during startup" >&2
        exit 1
      fi
      ((SECONDS < deadline)) || { echo "broker.sh: broker $n not ready after ${KAFKA_START_TIMEOUT:-90}s" >&2; exit 1; }
      sleep 0.1
    done ;;
  pid) need_pid ;;
  port) echo "$port" ;;
  wait-isr)
    [[ $# -ge 1 ]] || usage
    topic="$1"
    bootstrap="$(sed -n 's/^BOOTSTRAP=//p' "$dir/broker.env")"
    deadline=$((SECONDS + ${KAFKA_ISR_TIMEOUT:-120}))
    while :; do
      # "Topic: T Partition: 0 Leader: 2 Replicas: 2,3,1 Isr: 2,3,1 ...": done
      # when every partition has a leader and its ISR holds all its replicas.
      if out="$(kafka_run org.apache.kafka.tools.TopicCommand --bootstrap-server "$bootstrap" \
          --describe --topic "$topic" 2>&1)" \
          && python3 -c '
import re, sys
parts = re.findall(r"Partition:\s*(\d+)\s+Leader:\s*(\S+)\s+Replicas:\s*(\S+)\s+Isr:\s*(\S*)", sys.stdin.read())
ok = parts and all(l not in ("none", "-1") and set(r.split(",")) == set(i.split(",")) for _, l, r, i in parts)
sys.exit(0 if ok else 1)' <<<"$out"; then
        break
      fi
      ((SECONDS < deadline)) || { echo "broker.sh: $topic's ISR not full after ${KAFKA_ISR_TIMEOUT:-120}s:" >&2; echo "$out" >&2; exit 1; }
      sleep 0.5
    done ;;
  *) usage ;;
esac
