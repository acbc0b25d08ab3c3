#!/usr/bin/env bash
# benches/log/rolling-device.sh BUNDLE.tar.xz [OUT_DIR]: benches/log/rolling.sh on a
# bare machine, from what benches/log/bundle.sh packed (Java, the Kafka jars,
# HAProxy, pollbox). Stand-ins for curl when it is missing. Knobs as rolling.sh's
# (ROLLING_RATE ...). Copies the result file (and the kept work folder's logs,
# as a .tgz) to OUT_DIR if given.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
[[ $# -ge 1 ]] || { echo "usage: $0 BUNDLE.tar.xz [OUT_DIR]" >&2; exit 2; }
B="$(mktemp -d /tmp/pollbox-bundle.XXXXXX)"
if command -v xz >/dev/null; then
  tar -C "$B" -xJf "$1"
else
  python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$1" "$B"
fi
OUT_DIR="${2:-}"
export PATH="$B/jre/bin:$B/bin:$PATH"
export LD_LIBRARY_PATH="$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export POLLBOX_KAFKA_HOME="$B/kafka" KAFKA_NO_CDS=1 POLLBOX_BIN="$B/bin/pollbox"
if ! command -v curl >/dev/null; then
  # rolling.sh asks curl for /readyz's code (-o /dev/null -w '%{http_code}') and /metrics.
  cat >"$B/bin/curl" <<'PY'
#!/usr/bin/env python3
import sys, urllib.request, urllib.error
args = sys.argv[1:]
out = args[args.index("-o") + 1] if "-o" in args else None
fmt = args[args.index("-w") + 1] if "-w" in args else None
url = [a for a in args if a.startswith("http")][-1]
code, body = "000", b""
try:
    r = urllib.request.urlopen(url, timeout=2)
    code, body = str(r.status), r.read()
except urllib.error.HTTPError as e:
    code, body = str(e.code), e.read()
except Exception:
    pass
if out is None:
    sys.stdout.buffer.write(body)
if fmt:
    sys.stdout.write(fmt.replace("%{http_code}", code))
sys.exit(0 if code != "000" else 7)
PY
  chmod +x "$B/bin/curl"
fi
echo "# rolling-device.sh: $(nproc) cores, java $(java -version 2>&1 | head -1), $(haproxy -v | head -1)"
cd "$ROOT"
set +e
ROLLING_KEEP=1 benches/log/rolling.sh 2>&1 | tee "$B/rolling.log"
rc=${PIPESTATUS[0]}
set -e
if [[ -n "$OUT_DIR" ]]; then
  mkdir -p "$OUT_DIR"
  res="$(sed -n 's/^raw output: //p' "$B/rolling.log" | tail -1)"
  [[ -n "$res" && -f "$res" ]] && cp "$res" "$OUT_DIR/"
  work="$(sed -n 's/^rolling.sh: kept //p' "$B/rolling.log" | tail -1)"
  [[ -n "$work" && -d "$work" ]] && tar -C "$work" -czf "$OUT_DIR/rolling-work.tgz" \
    --exclude='kafka/*/data' --exclude='*.snapshot*' --exclude=bin . 2>/dev/null
  cp "$B/rolling.log" "$OUT_DIR/"
fi
exit "$rc"
