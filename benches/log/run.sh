#!/usr/bin/env bash
# The log's benchmarks in one run on one broker: replay.sh (apply cost; fills
# the big topic), poll.sh (polls while consuming; replays that topic),
# ingest.sh (ingest through the log against standalone, and the floor),
# stream.sh (publish on A, event on B); perf.sh (where a replay's CPU goes)
# when asked for. Each writes results/DATE-NAME.txt; this prints how long each
# took.
#
#   benches/log/run.sh
#   LOG_PARTS="ingest stream" benches/log/run.sh     # some of them
#
# Every knob of the four scripts and lib.sh applies.
set -euo pipefail
# shellcheck source=lib.sh source-path=SCRIPTDIR
. "$(dirname "$0")/lib.sh"
PARTS=${LOG_PARTS:-replay poll ingest stream}
build
broker_up
# One build and one broker for the four.
export LOG_BIN_DIR=$WORK/bin LOG_BUILD_DESC=$BUILD_DESC
export LOG_BOOTSTRAP=$BOOTSTRAP LOG_BROKER_PID=$BROKER_PID
big=replay-${REPLAY_RECORDS:-10000000}-$$
for part in $PARTS; do
  t0=$SECONDS
  case $part in
    replay) REPLAY_NEW_TOPIC=$big benches/log/replay.sh ;;
    poll)
      if [[ " $PARTS " == *" replay "* ]]; then POLL_TOPIC=${POLL_TOPIC:-$big} benches/log/poll.sh
      else benches/log/poll.sh; fi ;;
    ingest) benches/log/ingest.sh ;;
    stream) benches/log/stream.sh ;;
    perf) benches/log/perf.sh ;;
    *) echo "run.sh: unknown part $part" >&2; exit 2 ;;
  esac
  echo "# run.sh: $part took $((SECONDS - t0)) s"
done
