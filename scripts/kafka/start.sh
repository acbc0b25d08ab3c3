#!/usr/bin/env bash
# Starts a throwaway single-node Kafka (KRaft, broker+controller in one JVM)
# on 127.0.0.1 and returns once it serves requests. Prints on stdout:
#   BOOTSTRAP=127.0.0.1:PORT
#   PID=<the broker's java pid>
#   DIR=<folder holding its config, data and logs; give it to stop.sh>
# The same lines are written to DIR/broker.env. Progress and errors go to stderr.
#
# With --brokers 3: a cluster of three such JVMs (each broker and controller, a
# 3-voter quorum), started in parallel, each in DIR/b1, DIR/b2, DIR/b3 (config,
# data, server.log, kafka.pid), with replication factor 3 and
# min.insync.replicas 2 by default. It prints BOOTSTRAP=127.0.0.1:P1,..:P2,..:P3,
# PID=<broker 1's pid>, PIDS="P1 P2 P3", DIR=..., BROKERS=3. broker.sh DIR N
# kills, pauses, stops and restarts broker N.
#
# Options (or the environment variable in brackets):
#   --brokers N           1 (default) or more brokers [KAFKA_BROKERS]
#   --dir DIR             folder to use; must be absent or empty (default: a new
#                         mktemp folder under $TMPDIR or /tmp)
#   --port PORT           client port [KAFKA_PORT] (default: a free one);
#                         with --brokers N, N ports separated by commas
#   --controller-port P   KRaft controller port [KAFKA_CONTROLLER_PORT] (default: a
#                         free one); with --brokers N, N ports separated by commas
#   --partitions N        num.partitions for new topics [KAFKA_PARTITIONS] (default 1)
#   --auto-create-topics  let producers/metadata requests create topics
#                         [KAFKA_AUTO_CREATE_TOPICS=true] (default: off)
#   --set KEY=VALUE       any extra server.properties line (repeatable)
#   --watch-pid PID       stop the broker and remove DIR once PID exits, so a
#                         test that dies without calling stop.sh leaves nothing
#                         behind [KAFKA_WATCH_PID]
#   --timeout SECS        how long to wait for the broker [KAFKA_START_TIMEOUT] (default 90)
# KAFKA_HEAP_OPTS (default "-Xms128m -Xmx512m"; with several brokers
# "-Xms64m -Xmx384m" each) and KAFKA_JVM_OPTS are passed to java.
# Exit status: 0 ready; 1 failed (the log's tail is printed on stderr); 2 bad usage.
set -euo pipefail
# shellcheck source=lib.sh source-path=SCRIPTDIR
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

dir=""
port="${KAFKA_PORT:-}"
cport="${KAFKA_CONTROLLER_PORT:-}"
partitions="${KAFKA_PARTITIONS:-1}"
autocreate="${KAFKA_AUTO_CREATE_TOPICS:-false}"
watch="${KAFKA_WATCH_PID:-}"
timeout="${KAFKA_START_TIMEOUT:-90}"
brokers="${KAFKA_BROKERS:-1}"
extra=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --brokers) brokers="$2"; shift 2 ;;
    --dir) dir="$2"; shift 2 ;;
    --port) port="$2"; shift 2 ;;
    --controller-port) cport="$2"; shift 2 ;;
    --partitions) partitions="$2"; shift 2 ;;
    --auto-create-topics) autocreate=true; shift ;;
    --set) extra+=("$2"); shift 2 ;;
    --watch-pid) watch="$2"; shift 2 ;;
    --timeout) timeout="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "start.sh: unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
done

[[ "$brokers" =~ ^[1-9][0-9]?$ ]] || { echo "start.sh: --brokers wants a number from 1 to 99, not $brokers" >&2; exit 2; }

command -v java >/dev/null || { echo "start.sh: java not found (run scripts/kafka/install-deps.sh)" >&2; exit 1; }
libs="$(kafka_libs)"

created_dir=false
if [[ -z "$dir" ]]; then
  dir="$(mktemp -d "${TMPDIR:-/tmp}/pollbox-kafka.XXXXXX")"
  created_dir=true
else
  if [[ -e "$dir" && -n "$(ls -A "$dir" 2>/dev/null)" ]]; then
    echo "start.sh: --dir $dir is not empty" >&2
    exit 1
  fi
  [[ -e "$dir" ]] || created_dir=true
  mkdir -p "$dir"
fi
dir="$(cd "$dir" && pwd)"

# Free ports, all different, below the kernel's ephemeral range where it has
# room (else asked of the kernel): a port in that range can be handed to an
# outgoing connection's local end while its broker is down, and restart.sh then
# finds it taken.
free_ports() {
  python3 - "$1" <<'PY'
import random, socket, sys
n = int(sys.argv[1])
try:
    low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
except (OSError, ValueError, IndexError):
    low = 32768
socks = []
if low > 11000:
    for p in random.sample(range(10000, low), min(low - 10000, 4 * n + 64)):
        if len(socks) == n:
            break
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", p))
            socks.append(s)
        except OSError:
            s.close()
while len(socks) < n:
    s = socket.socket(); s.bind(("127.0.0.1", 0)); socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
}

# shellcheck disable=SC2207
common=($(kafka_jvm_common))

if [[ "$brokers" -gt 1 ]]; then
  # A cluster: N JVMs, each broker and controller (a static N-voter quorum), in
  # DIR/b1..DIR/bN, formatted with one cluster id and started in parallel.
  n="$brokers"
  # shellcheck disable=SC2206
  java_opts=(${KAFKA_HEAP_OPTS:--Xms64m -Xmx384m} "${common[@]}" ${KAFKA_JVM_OPTS:-}
    -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -Djava.awt.headless=true)
  IFS=, read -r -a want_ports <<<"$port"
  IFS=, read -r -a want_cports <<<"$cport"
  for list in "${#want_ports[@]}" "${#want_cports[@]}"; do
    [[ "$list" -eq 0 || "$list" -eq "$n" ]] \
      || { echo "start.sh: --port and --controller-port want $n ports (p1,p2,...) with --brokers $n" >&2; exit 2; }
  done
  # A min.insync.replicas of 2 (the durable setting) needs 3 replicas to lose one.
  rf=$((n < 3 ? n : 3)) isr=$((n < 3 ? 1 : 2))
  pids=()
  cfail() {
    echo "start.sh: $1" >&2
    local i
    for i in $(seq "$n"); do
      echo "--- broker $i:" >&2
      tail -n 15 "$dir/b$i/kafka.out" "$dir/b$i/server.log" >&2 2>/dev/null || true
    done
    for i in "${pids[@]+"${pids[@]}"}"; do kill -9 "$i" 2>/dev/null || true; done
    if $created_dir; then rm -rf "$dir"; else echo "start.sh: logs kept in $dir" >&2; fi
    exit 1
  }
  # One try with client ports $1 and controller ports $2 (space-separated):
  # 0 when every broker is ready, 3 when a port was taken (retried).
  try_cluster() {
    local -a ps cps
    read -r -a ps <<<"$1"
    read -r -a cps <<<"$2"
    local i voters="" cluster_id="" b
    for i in $(seq "$n"); do voters+="${voters:+,}$i@127.0.0.1:${cps[i-1]}"; done
    while [[ -z "$cluster_id" || "$cluster_id" == -* ]]; do
      cluster_id="$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=')"
    done
    pids=()
    local -a fmt=()
    for i in $(seq "$n"); do
      b="$dir/b$i"
      rm -rf "$b"
      mkdir -p "$b/data"
      cat >"$b/log4j2.properties" <<LOG
status = error
appender.file.type = File
appender.file.name = FILE
appender.file.fileName = $b/server.log
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.file.ref = FILE
LOG
      cat >"$b/server.properties" <<PROPS
# written by scripts/kafka/start.sh --brokers $n (broker $i)
process.roles=broker,controller
node.id=$i
controller.quorum.voters=$voters
listeners=PLAINTEXT://127.0.0.1:${ps[i-1]},CONTROLLER://127.0.0.1:${cps[i-1]}
advertised.listeners=PLAINTEXT://127.0.0.1:${ps[i-1]}
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
log.dirs=$b/data
num.partitions=$partitions
default.replication.factor=$rf
min.insync.replicas=$isr
unclean.leader.election.enable=false
auto.create.topics.enable=$autocreate
delete.topic.enable=true
offsets.topic.replication.factor=$rf
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=$rf
transaction.state.log.min.isr=$isr
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor=$rf
share.coordinator.state.topic.min.isr=$isr
group.initial.rebalance.delay.ms=0
num.network.threads=2
num.io.threads=2
num.recovery.threads.per.data.dir=1
log.retention.hours=-1
# Heartbeats every 0.5 s (not 2 s): a broker is unfenced, and a SIGTERM's
# controlled shutdown done, that much sooner. A dead broker is still fenced
# after broker.session.timeout.ms (9 s).
broker.heartbeat.interval.ms=500
PROPS
      # Broker 1 calls the first election well before the others would (0.5-1 s
      # against 1-2 s): no split vote when all start at once.
      if [[ $i -eq 1 ]]; then echo "controller.quorum.election.timeout.ms=500" >>"$b/server.properties"; fi
      local kv
      for kv in "${extra[@]+"${extra[@]}"}"; do echo "$kv" >>"$b/server.properties"; done
      java -Xmx256m -XX:TieredStopAtLevel=1 "${common[@]}" \
        -Dlog4j2.configurationFile="$KAFKA_SCRIPTS_DIR/log4j2-tools.properties" \
        -cp "$libs/*" kafka.tools.StorageTool format \
        --config "$b/server.properties" --cluster-id "$cluster_id" \
        >"$b/format.log" 2>&1 &
      fmt+=($!)
    done
    for i in "${fmt[@]}"; do wait "$i" || true; done
    for i in $(seq "$n"); do
      [[ -f "$dir/b$i/data/meta.properties" ]] || { cat "$dir/b$i/format.log" >&2; cfail "formatting broker $i's storage failed"; }
    done
    local -a cmd
    for i in $(seq "$n"); do
      b="$dir/b$i"
      cmd=(java "${java_opts[@]}" -Dlog4j2.configurationFile="$b/log4j2.properties"
        -cp "$libs/*" kafka.Kafka "$b/server.properties")
      # The command line, NUL-separated: broker.sh start runs it again.
      printf '%s\0' "${cmd[@]}" >"$b/java.cmd"
      bash -c 'echo $$ >"$1"; shift; exec "$@"' _ "$b/kafka.pid" "${cmd[@]}" \
        </dev/null >"$b/kafka.out" 2>&1 &
    done
    local _
    for i in $(seq "$n"); do
      for _ in $(seq 100); do [[ -s "$dir/b$i/kafka.pid" ]] && break; sleep 0.02; done
      pids+=("$(cat "$dir/b$i/kafka.pid")")
    done
    local deadline=$((SECONDS + timeout)) ready
    while :; do
      ready=0
      for i in $(seq "$n"); do
        b="$dir/b$i"
        if grep -q 'Kafka Server started' "$b/server.log" 2>/dev/null \
            && (exec 3<>"/dev/tcp/127.0.0.1/${ps[i-1]}") 2>/dev/null; then
          ready=$((ready + 1))
          continue
        fi
        kill -0 "${pids[i-1]}" 2>/dev/null && continue
        # A port we picked was taken meanwhile (by a parallel test): try again.
        if { [[ -z "$port" ]] && grep -q "bind to 127.0.0.1:${ps[i-1]}: Address already in use" "$b/server.log"; } \
            || { [[ -z "$cport" ]] && grep -q "bind to 127.0.0.1:${cps[i-1]}: Address already in use" "$b/server.log"; }; then
          local pid
          for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
          for pid in "${pids[@]}"; do while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done; done
          pids=()
          return 3
        fi
        cfail "broker $i exited during startup"
      done
      [[ $ready -eq $n ]] && break
      ((SECONDS < deadline)) || cfail "the brokers were not ready after ${timeout}s"
      sleep 0.1
    done
    port="${ps[*]}" cport="${cps[*]}"
  }
  for attempt in 1 2 3 4 5; do
    read -r -a free < <(free_ports $((2 * n)))
    ps=() cps=()
    for i in $(seq "$n"); do
      ps+=("${want_ports[i-1]:-${free[i-1]}}")
      cps+=("${want_cports[i-1]:-${free[n+i-1]}}")
    done
    rc=0
    try_cluster "${ps[*]}" "${cps[*]}" || rc=$?
    [[ $rc -eq 0 ]] && break
    [[ $attempt -lt 5 ]] || cfail "the free ports found were always taken"
    echo "start.sh: a port was taken meanwhile; retrying with other free ports" >&2
  done

  if [[ -n "$watch" ]]; then
    # Watchdog: once $watch is gone, stop every broker of DIR still running (by
    # its pid file, so one broker.sh restarted is found too) and remove DIR if
    # we made it (then with SIGKILL: the data goes anyway, as in stop.sh). It
    # ends by itself once DIR is gone (stop.sh).
    rm_dir=""
    $created_dir && rm_dir="$dir"
    # shellcheck disable=SC2016
    nohup bash -c '
      watch=$1 dir=$2 rm_dir=$3
      while kill -0 "$watch" 2>/dev/null && [ -f "$dir/broker.env" ]; do sleep 1; done
      [ -f "$dir/broker.env" ] || exit 0
      live=""
      for b in "$dir"/b*/; do
        pid=$(cat "$b/kafka.pid" 2>/dev/null) || continue
        if kill -0 "$pid" 2>/dev/null \
            && tr "\0" " " <"/proc/$pid/cmdline" 2>/dev/null | grep -qF "${b}server.properties"; then
          kill -CONT "$pid" 2>/dev/null
          if [ -n "$rm_dir" ]; then kill -9 "$pid" 2>/dev/null; else kill "$pid" 2>/dev/null; fi
          live="$live $pid"
        fi
      done
      [ -n "$live" ] || exit 0
      for _ in $(seq 150); do
        any=""
        for pid in $live; do kill -0 "$pid" 2>/dev/null && any=1; done
        [ -n "$any" ] || break
        sleep 0.1
      done
      for pid in $live; do kill -9 "$pid" 2>/dev/null; done
      [ -n "$rm_dir" ] && rm -rf "$rm_dir"
    ' _ "$watch" "$dir" "$rm_dir" </dev/null >/dev/null 2>&1 &
  fi

  bootstrap=""
  for p in $port; do bootstrap+="${bootstrap:+,}127.0.0.1:$p"; done
  {
    echo "BOOTSTRAP=$bootstrap"
    echo "PID=${pids[0]}"
    echo "PIDS=\"${pids[*]}\""
    echo "DIR=$dir"
    echo "BROKERS=$n"
  } | tee "$dir/broker.env"
  exit 0
fi
# shellcheck disable=SC2206
java_opts=(${KAFKA_HEAP_OPTS:--Xms128m -Xmx512m} "${common[@]}" ${KAFKA_JVM_OPTS:-}
  -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -Djava.awt.headless=true
  -Dlog4j2.configurationFile="$dir/log4j2.properties")

cat >"$dir/log4j2.properties" <<EOF
status = error
appender.file.type = File
appender.file.name = FILE
appender.file.fileName = $dir/server.log
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.file.ref = FILE
EOF

pid=""
fail() {
  echo "start.sh: $1" >&2
  tail -n 30 "$dir/kafka.out" "$dir/server.log" >&2 2>/dev/null || true
  if [[ -n "$pid" ]]; then kill -9 "$pid" 2>/dev/null || true; fi
  if $created_dir; then rm -rf "$dir"; else echo "start.sh: logs kept in $dir" >&2; fi
  exit 1
}

# One try: config, fresh storage, broker in the background, wait until ready.
# Returns 0 when ready, 3 when a port was taken (retried with new free ports).
try_start() {
  local p="$1" cp="$2"
  rm -rf "$dir/data" "$dir/server.log" "$dir/kafka.out" "$dir/kafka.pid"
  mkdir -p "$dir/data"
  cat >"$dir/server.properties" <<EOF
# written by scripts/kafka/start.sh
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$cp
listeners=PLAINTEXT://127.0.0.1:$p,CONTROLLER://127.0.0.1:$cp
advertised.listeners=PLAINTEXT://127.0.0.1:$p
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
log.dirs=$dir/data
num.partitions=$partitions
default.replication.factor=1
min.insync.replicas=1
auto.create.topics.enable=$autocreate
delete.topic.enable=true
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
num.network.threads=2
num.io.threads=2
num.recovery.threads.per.data.dir=1
log.retention.hours=-1
EOF
  local kv
  for kv in "${extra[@]+"${extra[@]}"}"; do echo "$kv" >>"$dir/server.properties"; done

  # A fresh cluster id: 16 random bytes, URL-safe base64 without padding
  # (what `kafka-storage random-uuid` prints; it never starts with '-').
  local cluster_id=""
  while [[ -z "$cluster_id" || "$cluster_id" == -* ]]; do
    cluster_id="$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=')"
  done
  if ! java -Xmx256m -XX:TieredStopAtLevel=1 "${common[@]}" \
      -Dlog4j2.configurationFile="$KAFKA_SCRIPTS_DIR/log4j2-tools.properties" \
      -cp "$libs/*" kafka.tools.StorageTool format \
      --config "$dir/server.properties" --cluster-id "$cluster_id" \
      >"$dir/format.log" 2>&1; then
    cat "$dir/format.log" >&2
    fail "formatting the storage failed"
  fi

  # The broker, in the background; its pid goes to DIR/kafka.pid.
  bash -c 'echo $$ >"$1"; shift; exec "$@"' _ "$dir/kafka.pid" \
    java "${java_opts[@]}" -cp "$libs/*" kafka.Kafka "$dir/server.properties" \
    </dev/null >"$dir/kafka.out" 2>&1 &
  local _
  for _ in $(seq 100); do [[ -s "$dir/kafka.pid" ]] && break; sleep 0.02; done
  pid="$(cat "$dir/kafka.pid")"

  # Ready = the broker logged "Kafka Server started" (it logs that after it has
  # caught up with the metadata log and been unfenced) and its port accepts.
  local deadline=$((SECONDS + timeout))
  until grep -q 'Kafka Server started' "$dir/server.log" 2>/dev/null \
      && (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; do
    if ! kill -0 "$pid" 2>/dev/null; then
      wait "$pid" 2>/dev/null || true
      # A port we picked was taken meanwhile (by a parallel test): try again.
      if { [[ -z "$port" ]] && grep -q "bind to 127.0.0.1:$p: Address already in use" "$dir/server.log"; } \
          || { [[ -z "$cport" ]] && grep -q "bind to 127.0.0.1:$cp: Address already in use" "$dir/server.log"; }; then
        return 3
      fi
      fail "the broker exited during startup"
    fi
    ((SECONDS < deadline)) || fail "the broker was not ready after ${timeout}s"
    sleep 0.1
  done
  port="$p" cport="$cp"
}

for attempt in 1 2 3 4 5; do
  p="$port" cp="$cport"
  if [[ -z "$p" || -z "$cp" ]]; then
    read -r f1 f2 < <(free_ports 2)
    [[ -n "$p" ]] || p="$f1"
    [[ -n "$cp" ]] || { cp="$f2"; [[ "$cp" != "$p" ]] || cp="$f1"; }
  fi
  rc=0
  try_start "$p" "$cp" || rc=$?
  [[ $rc -eq 0 ]] && break
  [[ $attempt -lt 5 ]] || fail "the free ports found were always taken"
  echo "start.sh: a port was taken meanwhile; retrying with other free ports" >&2
done

if [[ -n "$watch" ]]; then
  # Watchdog: once $watch is gone, stop the broker and (if we made it) the dir.
  rm_dir=""
  $created_dir && rm_dir="$dir"
  # shellcheck disable=SC2016
  nohup bash -c '
    watch=$1 pid=$2 dir=$3
    while kill -0 "$watch" 2>/dev/null && kill -0 "$pid" 2>/dev/null; do sleep 1; done
    if kill -0 "$pid" 2>/dev/null; then
      kill "$pid" 2>/dev/null
      for _ in $(seq 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null
      [ -n "$dir" ] && rm -rf "$dir"
    fi
  ' _ "$watch" "$pid" "$rm_dir" </dev/null >/dev/null 2>&1 &
fi

{
  echo "BOOTSTRAP=127.0.0.1:$port"
  echo "PID=$pid"
  echo "DIR=$dir"
} | tee "$dir/broker.env"
