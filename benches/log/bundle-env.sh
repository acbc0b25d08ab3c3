# shellcheck shell=bash
# Sourced: `. benches/log/bundle-env.sh BUNDLE.tar.xz` unpacks what
# benches/log/bundle.sh packed (Java, the Kafka jars, HAProxy, pollbox and the
# libraries they link) into a new folder $B and sets the environment the log's
# scripts need to run from it on a bare machine: PATH, LD_LIBRARY_PATH,
# POLLBOX_KAFKA_HOME, KAFKA_NO_CDS and POLLBOX_BIN; a curl stand-in when curl is
# missing. Used by rolling-device.sh, and by hand for the other benches/log
# scripts on the device (e.g. LOG_BIN_DIR=... benches/log/poll.sh).
B="$(mktemp -d /tmp/pollbox-bundle.XXXXXX)"
if command -v xz >/dev/null; then
  tar -C "$B" -xJf "$1"
else
  python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$1" "$B"
fi
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
