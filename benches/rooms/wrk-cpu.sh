# shellcheck shell=bash
# Sourced by benches/rooms/presence-read.sh and presence-page-floor.sh: one wrk run
# (one thread, 32 connections, on CPU 1) against a server, and the CPU it cost.
#
# wrk_cpu PORT PATH DEPTH PID SECONDS: GET PATH for SECONDS, DEPTH requests
# pipelined a write (1: plain; benches/rooms/path-pipeline.lua otherwise). Prints
# "REQUESTS TICKS NON_2XX": wrk's requests, the utime + stime clock ticks of PID
# over the run (/proc/PID/stat), and the answers that were not 2xx.
wrk_cpu() {
    local port=$1 path=$2 depth=$3 pid=$4 secs=$5 c0 c1 out
    c0=$(awk '{print $14 + $15}' "/proc/$pid/stat")
    if [ "$depth" = 1 ]; then
        out=$(taskset -c 1 wrk -t1 -c32 -d"${secs}s" "http://127.0.0.1:$port$path")
    else
        out=$(taskset -c 1 wrk -t1 -c32 -d"${secs}s" -s "$(dirname "${BASH_SOURCE[0]}")/path-pipeline.lua" \
            "http://127.0.0.1:$port" -- "$path" "$depth")
    fi
    c1=$(awk '{print $14 + $15}' "/proc/$pid/stat")
    echo "$(echo "$out" | awk '/requests in/ {print $1}') $((c1 - c0)) $(echo "$out" | awk '/Non-2xx/ {n = $NF} END {print n + 0}')"
}
