#!/usr/bin/env bash
# A join storm (docs/presence.md): PRESENCE_STORM (10,000) members join one room as
# fast as one generator thread opens them, while PRESENCE_WATCHERS (100) watchers
# stream the room's presence. The issue's bounds: bytes sent to each watcher at
# most 1.5x the final member list's bytes; the count right within 1 s of the
# last join.
#
#   bash benches/rooms/presence-storm.sh   # BENCH_NO_BUILD=1 / POLLBOX_BIN=path: see lib.sh
#
# A fresh server per round (one worker, CPU 0, benches/rooms/rooms.toml: 30,000
# connections); `pollbox load --presence-storm` on CPU 1 (watchers connect before
# the window; the storm starts with it). Per round the generator's presence lines
# (storm: written, joined, seen by every watcher; watcher bytes against the list),
# then /v1/boxes/room-0/~presence's count. Rounds: PRESENCE_REPS (3). Writes
# benches/rooms/results/<date>-presence-storm.txt.
source "$(dirname "$0")/lib.sh"
N=${PRESENCE_STORM:-10000}
W=${PRESENCE_WATCHERS:-100}
REPS=${PRESENCE_REPS:-3}
OUT=$RES/$(date -u +%F)-presence-storm${ROOMS_TAG:-}.txt
log_to "$OUT"
header "bash benches/rooms/presence-storm.sh: PRESENCE_STORM=$N PRESENCE_WATCHERS=$W PRESENCE_REPS=$REPS"
for rep in $(seq "$REPS"); do
    start_server
    echo "## round $rep"
    L -c 1 -R 10 --mix poll --warmup 1s --duration 4s \
        --presence-room room-0/ --presence-watchers "$W" --presence-storm "$N" 2>&1 | grep '^presence'
    echo "count served after: $(curl -s "$(URL)/v1/boxes/room-0/~presence" | cut -c1-120)"
    echo "pollbox_presence_members $(metric pollbox_presence_members); joins $(metric pollbox_presence_joins_total)"
    stop_server
done
machine_state
