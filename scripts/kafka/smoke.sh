#!/usr/bin/env bash
# smoke.sh: starts a broker, creates a topic, produces three records (one a
# tombstone), reads them back, compares, and stops the broker. Exit 0 if all
# went as expected. A quick check that this machine can run the Kafka tests.
set -euo pipefail
here="$(dirname "${BASH_SOURCE[0]}")"
env="$("$here/start.sh" --watch-pid $$)"
bootstrap="$(sed -n 's/^BOOTSTRAP=//p' <<<"$env")"
dir="$(sed -n 's/^DIR=//p' <<<"$env")"
trap '"$here/stop.sh" "$dir"' EXIT
"$here/topic.sh" "$bootstrap" create smoke 1 >/dev/null
want=$'k1\tv1\nk2\t{"a": 1}\nk1'
"$here/produce.sh" "$bootstrap" smoke --compression-codec zstd <<<"$want"
got="$("$here/consume.sh" "$bootstrap" smoke --max-messages 3 2>/dev/null)"
if [[ "$got" != "$want" ]]; then
  printf 'kafka smoke: FAILED\nwanted:\n%s\ngot:\n%s\n' "$want" "$got" >&2
  exit 1
fi
echo "kafka smoke: ok ($bootstrap)"
