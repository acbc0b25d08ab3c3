#!/usr/bin/env bash
# Side-by-side benchmark of pollbox, nginx, a straightforward axum server and a
# typed-serde may_minihttp server.
#
# One server core, one load core, everything in one run; the ratios against nginx are
# written down with the command that produced them. How and why: docs/perf-method.md.
#
#   benches/side-by-side/run.sh    # builds, measures (~10 min), prints the report and
#                                  # writes benches/side-by-side/results/<date>.md
#
# Knobs (environment): PERF_DURATION (s per measured run, 5), PERF_REPS (runs per
# server and test, interleaved; the report takes the median, 3), PERF_WARMUP (s, 1),
# PERF_RATE (open-loop req/s, 20000), PERF_CONNECTIONS (32), PERF_PIPELINE (16),
# PERF_BODY_BYTES (512), PERF_KEYS (1000), PERF_SERVER_CPU (0), PERF_LOAD_CPU (1),
# PERF_NICE (-10 as root, else 0), PERF_SKIP_BUILD=1, PERF_SKIP="syscalls mem scaling profile",
# PERF_SERVERS (default "pollbox nginx axum minihttp pollbox-ring"; pollbox-ring is pollbox
# with io_uring = true; minihttp is benches/minihttp-baseline, may_minihttp + serde into a
# typed struct; pollbox-before is the binary PERF_POLLBOX_BEFORE, e.g. a build of an
# earlier commit, for before/after rows), PERF_TESTS (the side-by-side tests, default
# "poll-closed poll-open ingest-open ingest-closed poll-pipelined poll-wrk
# ingest-pipelined ingest-batch"), PERF_BATCH_SIZE (messages per batch in ingest-batch,
# 100), PERF_BATCH_PIPELINE (batches in flight per connection there, 4),
# PERF_FRESH (1: a fresh server process for every measurement, so that its user/system
# split is its own, see cpu_fields; 0: one process per server for all tests),
# PERF_RESULTS (report path), PERF_WORK (raw data folder).
#
# Server CPU per request is reported as user and system time apart (utime and stime of
# /proc/PID/stat, all threads), beside their sum.
#
# Needs: nginx (Debian: nginx-light), wrk, perf (linux-perf), taskset, curl, python3;
# installed with apt-get when missing and run as root.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
DUR=${PERF_DURATION:-5}
REPS=${PERF_REPS:-3}
SYSCALL_DUR=${PERF_SYSCALL_DURATION:-5}
WARMUP=${PERF_WARMUP:-1}
RATE=${PERF_RATE:-20000}
CONNS=${PERF_CONNECTIONS:-32}
DEPTH=${PERF_PIPELINE:-16}
BODY=${PERF_BODY_BYTES:-512}
KEYS=${PERF_KEYS:-1000}
FRESH=${PERF_FRESH:-1}
BATCH_SIZE=${PERF_BATCH_SIZE:-100}
BATCH_DEPTH=${PERF_BATCH_PIPELINE:-4}
SERVER_CPU=${PERF_SERVER_CPU:-0}
LOAD_CPU=${PERF_LOAD_CPU:-1}
if [[ $(id -u) == 0 ]]; then NICE=${PERF_NICE:--10}; else NICE=${PERF_NICE:-0}; fi
SKIP=" ${PERF_SKIP:-} "
DATE=$(date +%Y-%m-%d)
RESULTS=${PERF_RESULTS:-$HERE/results/$DATE.md}
WORK=${PERF_WORK:-$(mktemp -d /tmp/pollbox-perf.XXXXXX)}
mkdir -p "$WORK"
JSONL=$WORK/results.jsonl
: >"$JSONL"
CLK_TCK=$(getconf CLK_TCK)
POLLBOX=$ROOT/target/release/pollbox
AXUM=$ROOT/benches/axum-baseline/target/release/axum-baseline
MINIHTTP=$ROOT/benches/minihttp-baseline/target/release/minihttp-baseline

say() { printf '%s\n' "$*" >&2; }
die() { say "run.sh: $*"; exit 1; }

# ---------------------------------------------------------------- tools and builds
need_tools() {
    local missing=()
    command -v nginx >/dev/null || [[ -x /usr/sbin/nginx ]] || missing+=(nginx-light)
    command -v wrk >/dev/null || missing+=(wrk)
    command -v perf >/dev/null || missing+=(linux-perf)
    command -v taskset >/dev/null || missing+=(util-linux)
    command -v curl >/dev/null || missing+=(curl)
    command -v python3 >/dev/null || missing+=(python3)
    [[ -x /usr/bin/time ]] || missing+=(time)
    if ((${#missing[@]})); then
        if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
            say "installing ${missing[*]}"
            apt-get update -qq && apt-get install -y -qq "${missing[@]}" >/dev/null
        else
            die "missing ${missing[*]} (apt-get install -y ${missing[*]})"
        fi
    fi
    PATH=$PATH:/usr/sbin
    # Syscall counting uses perf's tracepoints; without them nothing is counted.
    if perf stat -e raw_syscalls:sys_enter -x, -o /dev/null true 2>/dev/null; then
        HAVE_PERF=1
    else
        HAVE_PERF=0
        say "perf tracepoints unavailable (perf_event_paranoid / tracefs): no syscall counts or profile"
    fi
}

build() {
    if [[ ${PERF_SKIP_BUILD:-0} == 1 ]]; then return; fi
    say "building pollbox, axum-baseline and minihttp-baseline (release)"
    (cd "$ROOT" && cargo build --release -q -p pollbox)
    (cd "$ROOT" && cargo build --release -q --manifest-path benches/axum-baseline/Cargo.toml)
    (cd "$ROOT" && cargo build --release -q --manifest-path benches/minihttp-baseline/Cargo.toml)
}

# ---------------------------------------------------------------- servers
# Several servers run at once (all pinned to the server core, idle unless measured),
# so that the runs of different servers can be interleaved: a burst of outside load
# then lands on all of them alike instead of on one.
declare -A SERVER_URL SERVER_MAIN SERVER_PIDS
URL=""
PIDS=()

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

wait_up() {
    local port=$1 main=$2 i
    for i in $(seq 100); do
        if curl -s -o /dev/null "http://127.0.0.1:$port/v1/boxes/lg-0"; then return 0; fi
        kill -0 "$main" 2>/dev/null || die "server exited at start (see $WORK)"
        sleep 0.1
    done
    die "server on port $port did not answer within 10 s"
}

# start_server NAME CPUS [WORKERS]; NAME starts with pollbox, nginx, axum or minihttp.
start_server() {
    local name=$1 cpus=$2 workers=${3:-1} port main pids
    port=$(free_port)
    case $name in
        pollbox*)
            # pollbox-ring: the same server with the io_uring loop
            # (server.io_uring = true), beside the default.
            local cfg=$ROOT/config/pollbox.toml
            if [[ $name == pollbox-ring ]]; then
                cfg=$WORK/pollbox-ring.toml
                sed 's/^io_uring = false/io_uring = true/' "$ROOT/config/pollbox.toml" >"$cfg"
                grep -q '^io_uring = true' "$cfg" || die "could not turn io_uring on in $cfg"
            fi
            # pollbox-before: another build (PERF_POLLBOX_BEFORE), for before/after rows.
            local bin=$POLLBOX
            if [[ $name == pollbox-before ]]; then
                bin=${PERF_POLLBOX_BEFORE:?set PERF_POLLBOX_BEFORE to the pollbox binary to compare with}
            fi
            taskset -c "$cpus" nice -n "$NICE" "$bin" serve --config "$cfg" --listen "127.0.0.1:$port" \
                --workers "$workers" 2>"$WORK/$name-$port.log" &
            main=$!
            wait_up "$port" "$main"
            pids=$main
            ;;
        nginx*)
            local dir=$WORK/nginx-$port
            mkdir -p "$dir"
            sed -e "s#@DIR@#$dir#g" -e "s#@LISTEN@#127.0.0.1:$port#g" "$HERE/nginx.conf" >"$dir/nginx.conf"
            taskset -c "$cpus" nice -n "$NICE" nginx -c "$dir/nginx.conf" -p "$dir" 2>"$dir/stderr" &
            main=$!
            wait_up "$port" "$main"
            pids="$main $(pgrep -P "$main" | tr '\n' ' ')"
            [[ $(wc -w <<<"$pids") == 2 ]] || die "nginx: expected one master and one worker, got $pids"
            check_nginx_discards "$port"
            ;;
        axum*)
            taskset -c "$cpus" nice -n "$NICE" "$AXUM" --listen "127.0.0.1:$port" \
                --threads "$workers" 2>"$WORK/$name-$port.log" &
            main=$!
            wait_up "$port" "$main"
            pids=$main
            ;;
        minihttp*)
            # may's worker threads (set_workers); its date updater is a coroutine.
            taskset -c "$cpus" nice -n "$NICE" "$MINIHTTP" --listen "127.0.0.1:$port" \
                --threads "$workers" 2>"$WORK/$name-$port.log" &
            main=$!
            wait_up "$port" "$main"
            pids=$main
            ;;
        *) die "unknown server $name" ;;
    esac
    SERVER_URL[$name]=http://127.0.0.1:$port
    SERVER_MAIN[$name]=$main
    SERVER_PIDS[$name]=$pids
}

# restart_server NAME: a fresh, pre-seeded process in NAME's place (see cpu_fields).
restart_server() {
    stop_server "$1"
    start_server "$1" "$SERVER_CPU" 1
    [[ $1 == nginx* ]] || preseed "$1" "$KEYS"
}

# use_server NAME: the server the next measurement talks to.
use_server() {
    URL=${SERVER_URL[$1]}
    read -ra PIDS <<<"${SERVER_PIDS[$1]}"
}

stop_server() {
    local main=${SERVER_MAIN[$1]:-}
    if [[ -n $main ]]; then
        kill "$main" 2>/dev/null || true
        wait "$main" 2>/dev/null || true
    fi
    unset "SERVER_MAIN[$1]"
}

stop_all() {
    local name
    for name in "${!SERVER_MAIN[@]}"; do stop_server "$name"; done
}
trap stop_all EXIT

# nginx must read and discard a POST body and keep the connection: one write carrying
# a 512-byte POST and a GET must get two 200s on one connection.
check_nginx_discards() {
    python3 - "$1" <<'EOF' || die "nginx does not discard POST bodies cleanly"
import socket, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
body = b'{"key":"x","pad":"' + b"a" * 490 + b'"}'
s.sendall(b"POST /v1/boxes/x HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
          + b"GET /v1/boxes/y HTTP/1.1\r\nHost: a\r\n\r\n")
data, deadline = b"", time.time() + 2
while data.count(b"HTTP/1.1 200") < 2 and time.time() < deadline:
    s.settimeout(deadline - time.time()); data += s.recv(4096)
sys.exit(0 if data.count(b"HTTP/1.1 200") == 2 and b"close" not in data.lower() else 1)
EOF
}

# "utime stime": ticks of the given processes (all their threads), user and system
# apart, as /proc/PID/stat has them: the kernel scales the tick samples so that their
# sum is the precise run time, and keeps each of the two from ever going down.
ticks() {
    local user=0 sys=0 p f
    for p in "$@"; do
        read -ra f <<<"$(sed 's/^.*) //' "/proc/$p/stat")"
        user=$((user + f[11]))
        sys=$((sys + f[12]))
    done
    echo "$user $sys"
}

# cpu_fields "U0 S0" "U1 S1": the JSON fields of the CPU spent between two samples.
# The total is the difference of the sums (precise). The user/system split is NOT the
# difference of each: the kernel derives utime and stime from the process's whole
# lifetime (run time × the lifetime share of user ticks) and never lets either go down,
# so after a system-heavy test a user-heavy one shows its system time as 0. Each
# measurement therefore gets a fresh server (PERF_FRESH=1, the default; see
# restart_server), whose lifetime is the pre-seed plus this run, and the run's total is
# split by the lifetime shares at its end. With PERF_FRESH=0 the differences are used,
# and the split is only right when the previous tests had the same split.
cpu_fields() {
    local u0 s0 u1 s1
    read -r u0 s0 <<<"$1"
    read -r u1 s1 <<<"$2"
    awk -v u0="$u0" -v s0="$s0" -v u1="$u1" -v s1="$s1" -v fresh="$FRESH" 'BEGIN {
        d = u1 + s1 - u0 - s0
        if (fresh == 1) { user = (u1 + s1 > 0) ? d * u1 / (u1 + s1) : 0; how = "lifetime" }
        else { user = u1 - u0; how = "delta" }
        printf "\"ticks\":%d,\"user_ticks\":%.3f,\"sys_ticks\":%.3f,\"life_user_ticks\":%d,\"life_sys_ticks\":%d,\"split\":\"%s\"",
            d, user, d - user, u1, s1, how
    }'
}

rss_kb() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status"; }

record() { printf '%s\n' "$1" >>"$JSONL"; python3 "$HERE/summarize.py" line "$JSONL" >&2; }

# ---------------------------------------------------------------- measurements
# run_load SERVER TEST REP MODE LOAD_ARGS...   MODE: plain | syscalls
# Runs `pollbox load` pinned to the load core against SERVER; the server's CPU over the
# run goes into the record. With MODE=syscalls, perf counts the server's syscalls over
# the same window.
run_load() {
    local server=$1 test=$2 rep=$3 mode=$4
    shift 4
    use_server "$server"
    local base=$WORK/$server-$test-$rep
    local json=$base.json tfile=$base.time perfout="" perfpid=""
    local maxerr=0.01 t0 t1 start end
    # nginx's fixed answer fails the payload check by design (see summarize.py).
    [[ $server == nginx* ]] && maxerr=1
    if [[ $mode == syscalls && $HAVE_PERF == 1 ]]; then
        perfout=$base.perfstat
        perf stat -e 'syscalls:sys_enter_*' -e context-switches -x, -o "$perfout" \
            -p "$(IFS=,; echo "${PIDS[*]}")" 2>/dev/null &
        perfpid=$!
        sleep 0.5
    fi
    t0=$(ticks "${PIDS[@]}")
    start=$(date +%s.%N)
    /usr/bin/time -f '%U %S' -o "$tfile" \
        taskset -c "${LOAD_CPUS:-$LOAD_CPU}" nice -n "$NICE" "$POLLBOX" load --url "$URL" -q \
        --json "$json" --max-error-rate "$maxerr" "$@" >"$base.out" 2>&1 ||
        say "  (pollbox load exited non-zero: $base.out)"
    end=$(date +%s.%N)
    t1=$(ticks "${PIDS[@]}")
    local syscalls=null breakdown=null
    if [[ -n $perfpid ]]; then
        kill -INT "$perfpid" 2>/dev/null || true
        wait "$perfpid" 2>/dev/null || true
        syscalls=$(awk -F, '$3 ~ /^syscalls:sys_enter_/ && $1 ~ /^[0-9]+$/ {s += $1} END {print s + 0}' "$perfout")
        breakdown="\"$perfout\""
    fi
    local gen_u gen_s
    read -r gen_u gen_s < <(tail -n1 "$tfile")
    record "{\"kind\":\"load\",\"server\":\"$server\",\"test\":\"$test\",\"rep\":$rep,\"json\":\"$json\",$(cpu_fields "$t0" "$t1"),\"clk_tck\":$CLK_TCK,\"gen_user_s\":${gen_u:-0},\"gen_sys_s\":${gen_s:-0},\"wall_s\":$(awk "BEGIN {print $end - $start}"),\"syscalls\":$syscalls,\"breakdown\":$breakdown}"
}

# run_wrk SERVER TEST REP WRK_ARGS... (the URL is appended)
run_wrk() {
    local server=$1 test=$2 rep=$3
    shift 3
    use_server "$server"
    local base=$WORK/$server-$test-$rep t0 t1 start end
    t0=$(ticks "${PIDS[@]}")
    start=$(date +%s.%N)
    /usr/bin/time -f '%U %S' -o "$base.time" \
        taskset -c "$LOAD_CPU" nice -n "$NICE" wrk "$@" >"$base.wrk" 2>&1 || say "  (wrk failed: $base.wrk)"
    end=$(date +%s.%N)
    t1=$(ticks "${PIDS[@]}")
    local gen_u gen_s
    read -r gen_u gen_s < <(tail -n1 "$base.time")
    record "{\"kind\":\"wrk\",\"server\":\"$server\",\"test\":\"$test\",\"rep\":$rep,\"out\":\"$base.wrk\",$(cpu_fields "$t0" "$t1"),\"clk_tck\":$CLK_TCK,\"gen_user_s\":${gen_u:-0},\"gen_sys_s\":${gen_s:-0},\"wall_s\":$(awk "BEGIN {print $end - $start}")}"
}

# preseed SERVER N: one message into each of keys lg-0..lg-(N-1), so polls find a box.
preseed() {
    use_server "$1"
    taskset -c "$LOAD_CPU" nice -n "$NICE" "$POLLBOX" load --url "$URL" -q --preseed --keys "$2" \
        --body-bytes "$BODY" --mix poll:100 -c 1 -d 200ms --rate 50 >"$WORK/preseed-$1-$2.out" 2>&1 ||
        die "preseed of $2 keys into $1 failed: $(tail -3 "$WORK/preseed-$1-$2.out")"
}

# One measurement of TEST against SERVER (repetition REP).
measure() {
    local server=$1 test=$2 rep=$3
    local common=(--keys "$KEYS" --warmup "${WARMUP}s" -d "${DUR}s" -c "$CONNS")
    local short=(--keys "$KEYS" --warmup 1s -d "${SYSCALL_DUR}s" -c "$CONNS")
    case $test in
        poll-closed) run_load "$server" "$test" "$rep" plain "${common[@]}" --mix poll:100 ;;
        poll-open) run_load "$server" "$test" "$rep" plain "${common[@]}" --mix poll:100 --rate "$RATE" ;;
        ingest-open)
            run_load "$server" "$test" "$rep" plain "${common[@]}" --mix ingest:100 \
                --body-bytes "$BODY" --rate "$RATE"
            ;;
        ingest-closed)
            # One message per request, not pipelined: single-message ingest.
            run_load "$server" "$test" "$rep" plain "${common[@]}" --mix ingest:100 \
                --body-bytes "$BODY"
            ;;
        ingest-batch)
            # Batches (POST /v1/ingest, a JSON array), pipelined: messages/s end to end.
            run_load "$server" "$test" "$rep" plain "${common[@]}" --mix batch:100 \
                --batch-size "$BATCH_SIZE" --body-bytes "$BODY" --pipeline "$BATCH_DEPTH"
            ;;
        poll-pipelined)
            run_load "$server" "$test" "$rep" plain "${common[@]}" --mix poll:100 --pipeline "$DEPTH"
            ;;
        poll-wrk)
            use_server "$server"
            run_wrk "$server" "$test" "$rep" -t1 -c"$CONNS" -d"${DUR}s" -s "$HERE/pipeline.lua" "$URL" -- "$DEPTH"
            ;;
        ingest-pipelined)
            run_load "$server" "$test" "$rep" plain "${common[@]}" --mix ingest:100 \
                --body-bytes "$BODY" --pipeline "$DEPTH"
            ;;
        poll-open-syscalls)
            run_load "$server" "$test" "$rep" syscalls "${short[@]}" --mix poll:100 --rate "$RATE"
            ;;
        poll-closed-syscalls)
            run_load "$server" "$test" "$rep" syscalls "${short[@]}" --mix poll:100
            ;;
        poll-pipelined-syscalls)
            run_load "$server" "$test" "$rep" syscalls "${short[@]}" --mix poll:100 --pipeline "$DEPTH"
            ;;
        *) die "unknown test $test" ;;
    esac
}

# All three servers up at once on the server core; each test runs REPS times, the
# servers in a rotating order within each repetition.
side_by_side() {
    local servers test rep i n
    read -ra servers <<<"${PERF_SERVERS:-pollbox nginx axum minihttp pollbox-ring}"
    say "== side by side: ${servers[*]} on core $SERVER_CPU, generator on core $LOAD_CPU"
    for n in "${servers[@]}"; do start_server "$n" "$SERVER_CPU" 1; done
    for n in "${servers[@]}"; do [[ $n == nginx ]] || preseed "$n" "$KEYS"; done
    local tests
    read -ra tests <<<"${PERF_TESTS:-poll-closed poll-open ingest-open ingest-closed poll-pipelined poll-wrk ingest-pipelined ingest-batch}"
    for test in "${tests[@]}"; do
        for ((rep = 1; rep <= REPS; rep++)); do
            for ((i = 0; i < ${#servers[@]}; i++)); do
                n=${servers[(i + rep - 1) % ${#servers[@]}]}
                # nginx's fixed answer has no batch endpoint to stand in for.
                [[ $test == ingest-batch && $n == nginx* ]] && continue
                [[ $FRESH == 1 ]] && restart_server "$n"
                measure "$n" "$test" "$rep"
            done
        done
    done
    if [[ $HAVE_PERF == 1 && $SKIP != *" syscalls "* ]]; then
        # Syscall counts are structural (how many requests a read carries), one run each.
        for test in poll-open-syscalls poll-closed-syscalls poll-pipelined-syscalls; do
            for n in "${servers[@]}"; do measure "$n" "$test" 1; done
        done
    fi
    if [[ $HAVE_PERF == 1 && $SKIP != *" profile "* ]]; then profile pollbox; fi
    for n in "${servers[@]}"; do stop_server "$n"; done
}

# perf record of a pollbox server while it answers pipelined GETs, then pipelined ingests.
profile() {
    local server=$1 test mix
    use_server "$server"
    local main=${SERVER_MAIN[$server]}
    for test in poll-pipelined ingest-pipelined; do
        mix=poll:100
        [[ $test == ingest-* ]] && mix=ingest:100
        local data=$WORK/perf-$test.data
        taskset -c "$LOAD_CPU" nice -n "$NICE" "$POLLBOX" load --url "$URL" -q --keys "$KEYS" \
            -d 7s -c "$CONNS" --mix "$mix" --body-bytes "$BODY" --pipeline "$DEPTH" \
            >"$WORK/profile-$test.out" 2>&1 &
        local gen=$!
        sleep 1
        perf record -g -o "$data" -p "$main" -- sleep 5 >/dev/null 2>&1 || true
        wait "$gen" || true
        perf report -i "$data" --stdio --no-children -g none --percent-limit 1 2>/dev/null |
            grep -v '^#' | grep -v '^$' | head -30 >"$WORK/profile-$test.txt" || true
        perf report -i "$data" --stdio --no-children 2>/dev/null | head -300 >"$WORK/profile-$test-callers.txt" || true
        record "{\"kind\":\"profile\",\"test\":\"$test\",\"file\":\"$WORK/profile-$test.txt\"}"
    done
}

# RSS of a fresh server after every one of N keys got one message.
memory() {
    local server n boxes r0 r1 r2 main
    say "== memory"
    for server in pollbox axum minihttp; do
        for n in 100000 1000000; do
            start_server "$server" "$SERVER_CPU" 1
            use_server "$server"
            main=${SERVER_MAIN[$server]}
            r0=$(rss_kb "$main")
            preseed "$server" "$n"
            r1=$(rss_kb "$main")
            if [[ $server == pollbox ]]; then
                boxes=$(curl -s "$URL/metrics" | awk '$1 == "pollbox_boxes" {print $2}')
            else
                boxes=$(curl -s "$URL/count")
            fi
            # jemalloc gives dirty pages back after dirty_decay_ms (5 s in pollbox).
            sleep 6
            r2=$(rss_kb "$main")
            record "{\"kind\":\"mem\",\"server\":\"$server\",\"keys\":$n,\"boxes\":${boxes:-0},\"rss_start_kb\":$r0,\"rss_kb\":$r1,\"rss_settled_kb\":$r2}"
            stop_server "$server"
        done
    done
}

# Workers 1 vs 2 with the server allowed on both cores. There are only two cores, so
# the generator shares them: compared are CPU per request at a fixed rate (generator
# on the load core) and, for pipelined load where the generator needs far less CPU per
# request than the server, throughput per core the server actually used (generator
# with two threads on both cores). See docs/perf-method.md.
scaling() {
    local rep w
    say "== scaling: pollbox --workers 1 vs 2 on cores 0,1"
    start_server pollbox-w1 0,1 1
    start_server pollbox-w2 0,1 2
    preseed pollbox-w1 "$KEYS"
    preseed pollbox-w2 "$KEYS"
    for ((rep = 1; rep <= REPS; rep++)); do
        for w in 1 2; do
            LOAD_CPUS=$LOAD_CPU run_load "pollbox-w$w" poll-open-2cores "$rep" plain --keys "$KEYS" \
                --warmup "${WARMUP}s" -d "${DUR}s" -c "$CONNS" --mix poll:100 --rate "$RATE"
            LOAD_CPUS=0,1 run_load "pollbox-w$w" poll-pipelined-2cores "$rep" plain --keys "$KEYS" \
                --warmup "${WARMUP}s" -d "${DUR}s" -c "$CONNS" -t 2 --mix poll:100 --pipeline "$DEPTH"
        done
    done
    stop_server pollbox-w1
    stop_server pollbox-w2
}

# Processes other than ours using more than 5% CPU (ps's %CPU is over each one's
# lifetime): neighbours that may have disturbed the run.
busy_processes() {
    # shellcheck disable=SC2009 # pgrep cannot print %CPU; ps's lines are filtered.
    ps -eo pcpu=,args= --sort=-pcpu | grep -v -e "$WORK" -e 'nginx: ' -e 'ps -eo' |
        awk '$1 > 5 {c = $2; for (i = 3; i <= NF && i <= 6; i++) c = c " " $i; printf "%s%s `%s`", sep, $1, c; sep="; "}'
}

# The scheduler tick rate (CONFIG_HZ), which samples the user/system split; "?" if the
# kernel's config is not readable.
kernel_hz() {
    local hz
    hz=$({ zcat /proc/config.gz 2>/dev/null || cat "/boot/config-$(uname -r)" 2>/dev/null; } |
        awk -F= '$1 == "CONFIG_HZ" {print $2}')
    echo "${hz:-?}"
}

meta() {
    local busy model
    busy=$(busy_processes)
    model=$(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)
    python3 - <<EOF >>"$JSONL"
import json
print(json.dumps({"kind": "meta", "date": "$(date '+%Y-%m-%d %H:%M %Z')",
  "command": "benches/side-by-side/run.sh${PERF_ENV_SHOWN:+ (with $PERF_ENV_SHOWN)}",
  "commit": "$(cd "$ROOT" && git rev-parse --short HEAD)$(cd "$ROOT" && git diff --quiet -- crates || echo ' + uncommitted changes in crates/')",
  "machine": "$(nproc) cores, ${model//\"/}, $(uname -r)",
  "server_cpu": "$SERVER_CPU", "load_cpu": "$LOAD_CPU", "nice": "$NICE",
  "duration": $DUR, "reps": $REPS, "syscall_duration": $SYSCALL_DUR, "warmup": $WARMUP, "rate": $RATE, "connections": $CONNS,
  "pipeline": $DEPTH, "body_bytes": $BODY, "keys": $KEYS, "work": "$WORK",
  "batch_size": $BATCH_SIZE, "batch_pipeline": $BATCH_DEPTH, "hz": "$(kernel_hz)", "fresh": $FRESH,
  "uptime_before": "$(uptime | sed 's/.*load average/load average/')",
  "busy_before": "${busy//\"/}"}))
EOF
}

main() {
    PERF_ENV_SHOWN=$(env | grep '^PERF_' | tr '\n' ' ' || true)
    need_tools
    build
    [[ -x $POLLBOX ]] || die "pollbox binary missing"
    [[ " ${PERF_SERVERS:-axum} " != *" axum "* || -x $AXUM ]] || die "axum-baseline binary missing"
    [[ " ${PERF_SERVERS:-minihttp} " != *" minihttp "* || -x $MINIHTTP ]] || die "minihttp-baseline binary missing"
    # Run copies: a rebuild in the shared target folder during the run must neither
    # change the server under test nor take perf's symbols away.
    mkdir -p "$WORK/bin"
    cp "$POLLBOX" "$WORK/bin/"
    if [[ -x $AXUM ]]; then cp "$AXUM" "$WORK/bin/"; fi
    if [[ -x $MINIHTTP ]]; then cp "$MINIHTTP" "$WORK/bin/"; fi
    POLLBOX=$WORK/bin/pollbox
    AXUM=$WORK/bin/axum-baseline
    MINIHTTP=$WORK/bin/minihttp-baseline
    ulimit -n 65536 2>/dev/null || true
    meta
    say "raw data in $WORK; $(uptime)"
    side_by_side
    [[ $SKIP == *" mem "* ]] || memory
    [[ $SKIP == *" scaling "* ]] || scaling
    local busy
    busy=$(busy_processes)
    printf '%s\n' "{\"kind\":\"meta\",\"uptime_after\":\"$(uptime | sed 's/.*load average/load average/')\",\"busy_after\":\"${busy//\"/}\"}" >>"$JSONL"
    python3 "$HERE/summarize.py" table "$JSONL" | tee "$RESULTS"
    say "report: $RESULTS"
}

main "$@"
