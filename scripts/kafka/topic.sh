#!/usr/bin/env bash
# topic.sh BOOTSTRAP create NAME [PARTITIONS] [more kafka-topics args...]
#   e.g. create pollbox 4 --replication-factor 3 --config min.insync.replicas=2
#   (PARTITIONS defaults to the broker's num.partitions: start.sh --partitions)
# topic.sh BOOTSTRAP list
# topic.sh BOOTSTRAP describe [NAME]
# topic.sh BOOTSTRAP delete NAME
# topic.sh BOOTSTRAP offsets NAME      # "topic:partition:end-offset" per partition
# Wraps Kafka's TopicCommand (kafka-topics.sh); extra args are passed through,
# e.g. --config cleanup.policy=compact.
set -euo pipefail
# shellcheck source=lib.sh source-path=SCRIPTDIR
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
usage() { sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
[[ $# -ge 2 ]] || usage
bootstrap="$1" cmd="$2"
shift 2
case "$cmd" in
  create)
    [[ $# -ge 1 ]] || usage
    name="$1"; shift
    # Without PARTITIONS, the broker's num.partitions (start.sh --partitions).
    if [[ $# -ge 1 && "$1" != -* ]]; then set -- --partitions "$@"; fi
    kafka_run org.apache.kafka.tools.TopicCommand --bootstrap-server "$bootstrap" \
      --create --topic "$name" "$@" ;;
  list)
    kafka_run org.apache.kafka.tools.TopicCommand --bootstrap-server "$bootstrap" --list --exclude-internal "$@" ;;
  describe)
    if [[ $# -ge 1 && "$1" != -* ]]; then set -- --topic "$@"; fi
    kafka_run org.apache.kafka.tools.TopicCommand --bootstrap-server "$bootstrap" --describe "$@" ;;
  delete)
    [[ $# -ge 1 ]] || usage
    name="$1"; shift
    kafka_run org.apache.kafka.tools.TopicCommand --bootstrap-server "$bootstrap" \
      --delete --topic "$name" "$@" ;;
  offsets)
    [[ $# -ge 1 ]] || usage
    name="$1"; shift
    kafka_run org.apache.kafka.tools.GetOffsetShell --bootstrap-server "$bootstrap" \
      --topic "$name" --time latest "$@" ;;
  *) usage ;;
esac
