#!/usr/bin/env bash
# pollbox's validating scanner against the C++ simdjson library's full parse
# (every byte validated, the tape built) on the projection bench's bodies, time
# per message, alternated round by round on one core: how far is the scanner
# from the state of the art on these bodies?
#
#   benches/simdjson-ref/run.sh | tee benches/simdjson-ref/results/DATE-MACHINE.txt   # ~1 min
#
# Knobs: REF_ROUNDS (5), REF_CPU (1), REF_BODIES ("load_8KiB 8KiB load_512B 512B"),
# REF_BENCH (a prebuilt projection bench binary), REF_BIN (a prebuilt ref binary).
# Installs libsimdjson-dev (Debian) if the header is missing.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
ROUNDS=${REF_ROUNDS:-5}
CPU=${REF_CPU:-1}
BODIES=${REF_BODIES:-load_8KiB 8KiB load_512B 512B}
WORK=$(mktemp -d /tmp/simdjson-ref.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
REF=${REF_BIN:-}
if [[ -z $REF ]]; then
    if [[ ! -e /usr/include/simdjson.h ]]; then
        apt-get install -y -q libsimdjson-dev >/dev/null
    fi
    REF=$WORK/ref
    g++ -O2 -o "$REF" "$ROOT/benches/simdjson-ref/ref.cpp" -lsimdjson
fi
BENCH=${REF_BENCH:-}
if [[ -z $BENCH ]]; then
    BENCH=$(cd "$ROOT" && cargo bench -q -p pollbox-benches --bench projection --no-run --message-format=json 2>/dev/null |
        python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "projection":
        print(m["executable"])')
fi
echo "# $(date -u +%FT%TZ) $(nproc) cores, $(awk -F: '/model name/ {print $2; exit}' /proc/cpuinfo)"
echo "# simdjson $(dpkg-query -W -f '${Version}' libsimdjson-dev 2>/dev/null || echo '?'); rounds $ROUNDS on core $CPU"
# ns per message: N iterations timed as a whole (the process start is < 1 ms).
per_msg() {
    local s e
    s=$(date +%s%N)
    "$@" >/dev/null
    e=$(date +%s%N)
    echo $(((e - s) / N))
}
for b in $BODIES; do
    PROJECTION_CALLGRIND=dump:$b:1 "$BENCH" >"$WORK/$b.json"
    case $b in *8KiB*) N=100000 ;; *) N=1000000 ;; esac
    "$REF" "$WORK/$b.json" 1 | sed 's/^/# /'
    for r in $(seq "$ROUNDS"); do
        sc=$(PROJECTION_CALLGRIND=scanner:$b:$N per_msg taskset -c "$CPU" "$BENCH")
        sj=$(per_msg taskset -c "$CPU" "$REF" "$WORK/$b.json" "$N")
        echo "$b r$r scanner=$sc simdjson=$sj"
    done
done | tee "$WORK/lines.txt"
python3 - "$WORK/lines.txt" <<'PY'
import collections, statistics, sys
d = collections.defaultdict(list)
for l in open(sys.argv[1]):
    if l.startswith("#"):
        continue
    p = l.split()
    for kv in p[2:]:
        k, v = kv.split("=")
        d[(p[0], k)].append(int(v))
print("\n| body | scanner (ns, median) | simdjson full parse (ns, median) | simdjson / scanner |")
print("|---|---:|---:|---:|")
for b in dict.fromkeys(k[0] for k in d):
    sc, sj = statistics.median(d[(b, "scanner")]), statistics.median(d[(b, "simdjson")])
    print(f"| {b} | {sc:,.0f} | {sj:,.0f} | {sj / sc:.2f} |")
PY
