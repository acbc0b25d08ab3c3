#!/usr/bin/env bash
# produce.sh BOOTSTRAP TOPIC [more kafka-console-producer args...] < lines
# Each stdin line "KEY<TAB>VALUE" becomes one record (split at the first TAB).
# A line "KEY" with no TAB becomes a tombstone (null value); "KEY<TAB>" has an
# empty value. acks=all; extra args are passed through, e.g.
# --compression-codec zstd or --command-property linger.ms=5.
set -euo pipefail
# shellcheck source=lib.sh source-path=SCRIPTDIR
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
[[ $# -ge 2 ]] || { sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
bootstrap="$1" topic="$2"
shift 2
null='__POLLBOX_KAFKA_NULL__'
# Lines without a TAB get "<TAB>$null", which the producer turns into null.
sed -u "/\t/!s/\$/\t$null/" | kafka_run org.apache.kafka.tools.ConsoleProducer \
  --bootstrap-server "$bootstrap" --topic "$topic" --request-required-acks all \
  --reader-property parse.key=true --reader-property key.separator=$'\t' \
  --reader-property null.marker="$null" "$@"
