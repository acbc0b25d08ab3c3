# shellcheck shell=bash
# Shared by the benches' lib.sh files (sourced): stopping what a script
# started, and asking a node whether it is ready and what its metrics say.

# stop_pids PID...: SIGTERM each, wait up to 5 s for each to end, then SIGKILL.
stop_pids() {
  local p
  for p in "$@"; do
    kill -TERM "$p" 2>/dev/null || true
  done
  for p in "$@"; do
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null || true
  done
}

# ready PORT: /readyz answers 200 (bash's /dev/tcp: no process forked per try).
ready() {
  local line=""
  { exec 3<>"/dev/tcp/127.0.0.1/$1"; } 2>/dev/null || return 1
  printf 'GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n' >&3
  read -r line <&3 || true
  exec 3<&- 3>&-
  [[ "$line" == *" 200 "* ]]
}

# metric PORT NAME: the sum of every series of NAME on /metrics.
metric() {
  curl -sf "http://127.0.0.1:$1/metrics" | awk -v n="$2" '$1 == n || index($1, n "{") == 1 { s += $2 } END { printf "%.10g\n", s }'
}
