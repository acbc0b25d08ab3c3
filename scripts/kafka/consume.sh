#!/usr/bin/env bash
# consume.sh BOOTSTRAP TOPIC [more kafka-console-consumer args...]
# Prints every record of TOPIC from the beginning as "KEY<TAB>VALUE" (a
# tombstone as "KEY" alone: the format produce.sh reads), then exits once no
# record came for 5 s (CONSUME_TIMEOUT_MS). Extra args are passed through,
# e.g. --max-messages 10, --partition 0 --offset 5, or
# --formatter-property print.partition=true.
set -euo pipefail
# shellcheck source=lib.sh source-path=SCRIPTDIR
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
[[ $# -ge 2 ]] || { sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
bootstrap="$1" topic="$2"
shift 2
null='__POLLBOX_KAFKA_NULL__'
from=(--from-beginning)
for a in "$@"; do [[ "$a" == --offset ]] && from=(); done
# TimeoutException at the end is how the console consumer stops on --timeout-ms.
kafka_run org.apache.kafka.tools.consumer.ConsoleConsumer \
  --bootstrap-server "$bootstrap" --topic "$topic" "${from[@]}" \
  --timeout-ms "${CONSUME_TIMEOUT_MS:-5000}" \
  --formatter-property print.key=true --formatter-property key.separator=$'\t' \
  --formatter-property null.literal="$null" "$@" \
  | sed -u "s/\t$null\$//"
