#!/usr/bin/env bash
# The fault suite's CI schedule: builds the release binaries (pollbox and
# pollbox-faults) and runs one fixed-seed schedule of faults against three
# Kafka brokers, two pollbox nodes and HAProxy (crates/faults/README.md).
# About 2.5 minutes on a quiet 2-core machine, plus the build. Needs root
# (network namespaces), Java (scripts/kafka/install-deps.sh) and HAProxy;
# installs what is missing.
#
#   crates/faults/ci.sh                                  # seed 7, 75 s of faults
#   FAULTS_SEED=3 FAULTS_DURATION=300 crates/faults/ci.sh
#   FAULTS_ALLOW="at-most-once" crates/faults/ci.sh       # a known bug: reported, not failing
#   FAULTS_LOG_CLIENT='"fetch.wait.max.ms" = "500"' crates/faults/ci.sh   # [log.client] lines for the nodes
#
# Exit status: 0 valid; 1 a promise was broken (the report is printed; the
# history is in $FAULTS_OUT/history.jsonl, the cluster's logs in
# $FAULTS_OUT/cluster/); 2 the suite could not run.
set -euo pipefail
cd "$(dirname "$0")/../.."
seed="${FAULTS_SEED:-7}"
duration="${FAULTS_DURATION:-75}"
out="${FAULTS_OUT:-target/faults/ci}"
allow=()
for p in ${FAULTS_ALLOW:-}; do allow+=(--allow "$p"); done

if [ "$(id -u)" != 0 ]; then
  echo "faults: needs root (network namespaces, veth links)" >&2
  exit 2
fi
# One run at a time: two would share the namespaces, the addresses and the
# nodes' snapshot folders under $out (a node then loads the other run's
# snapshot, and the checker rightly reports replicas that differ).
mkdir -p "$out"
exec 9>"$out.lock"
if ! flock -n 9; then
  echo "faults: another fault suite is running here ($out.lock); wait for it" >&2
  exit 2
fi
if ! command -v haproxy >/dev/null || ! command -v ip >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends haproxy iproute2 >/dev/null
  # Debian starts HAProxy as a service on install; the suite runs its own.
  # Only that service is stopped (by its unit, else its pid file), never a
  # haproxy by name.
  systemctl stop haproxy >/dev/null 2>&1 || true
  if [ -s /run/haproxy.pid ] && command -v start-stop-daemon >/dev/null; then
    start-stop-daemon --stop --quiet --oknodo --retry 5 --pidfile /run/haproxy.pid \
      --exec /usr/sbin/haproxy >/dev/null 2>&1 || true
  fi
fi
scripts/kafka/install-deps.sh

echo "== pollbox-faults: build (release)"
cargo build --release -q -p pollbox -p pollbox-faults

echo "== pollbox-faults: seed $seed, $duration s of faults, into $out"
start=$SECONDS
rc=0
target/release/pollbox-faults --seed "$seed" --duration "$duration" --out "$out" \
  "${allow[@]+"${allow[@]}"}" || rc=$?
echo "== pollbox-faults: $((SECONDS - start)) s, exit $rc"
if [ "$rc" -ne 0 ]; then
  echo "history: $out/history.jsonl; violations: $out/violations.jsonl; logs: $out/cluster/"
fi
exit "$rc"
