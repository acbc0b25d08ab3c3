#!/bin/bash
# benches/rooms/rss-boxes.sh: RSS with 100,000 and 1,000,000 boxes (one 512 B message each,
# `pollbox load --preseed`), boxes.rooms = true and false; server on CPU 0, load on CPU 1.
# Each line: RSS 6 s after the ingest (jemalloc's dirty decay is 5 s), its anonymous part
# (RssAnon: RSS less the binary's and libraries' file pages), RSS at start, bytes a box
# ((RSS - RSS at start) / N), the box count and the accounted boxes' bytes; then what rooms
# cost a box: accounted (on - off) / N, RSS (on - off) / N. With the axum + serde_json
# baseline built (benches/axum-baseline, as benches/side-by-side/run.sh builds it), the same
# for it (one thread), and pollbox's bytes a box (rooms on) over axum's.
cd "$(dirname "$0")/../.."
AXUM=benches/axum-baseline/target/release/axum-baseline
rss_kb() { awk "/^$2:/{print \$2}" /proc/$1/status; }
settle() { # pid n label: preseed n boxes, wait, print RSS; sets rss, anon, start
  local pid=$1 n=$2
  sleep 1
  start=$(rss_kb $pid VmRSS)
  taskset -c 1 ./target/release/pollbox load --url http://127.0.0.1:18991 --preseed --keys $n --duration 1 > /tmp/rss-load.log 2>&1
  sleep 6
  rss=$(rss_kb $pid VmRSS)
  anon=$(rss_kb $pid RssAnon)
  echo -n "$3: RSS $((rss/1024)) MiB ($rss kB), anonymous $anon kB, at start $start kB, $(( (rss - start) * 1024 / n )) B a box"
}
for n in 100000 1000000; do
 for rooms in true false; do
  cfg=/tmp/rss-$rooms.toml
  cp config/pollbox.toml $cfg
  sed -i "s/^rooms = .*/rooms = $rooms                # (bench)/" $cfg
  sed -i 's/^listen = .*/listen = "127.0.0.1:18991"/' $cfg
  taskset -c 0 ./target/release/pollbox serve --config $cfg > /tmp/rss-server.log 2>&1 &
  pid=$!
  settle $pid $n "boxes $n rooms=$rooms"
  boxes=$(curl -s 127.0.0.1:18991/metrics | awk '/^pollbox_boxes /{print $2}')
  acc=$(curl -s 127.0.0.1:18991/metrics | awk '/^pollbox_accounted_bytes\{part="boxes"\}/{print $2}')
  echo ", pollbox_boxes $boxes, accounted boxes $acc B"
  eval "acc_${rooms}=$acc rss_${rooms}=$rss per_${rooms}=$(( (rss - start) * 1024 / n ))"
  kill $pid; wait $pid 2>/dev/null
 done
 echo "boxes $n: rooms cost $(( (acc_true - acc_false) / n )) B a box accounted, $(( (rss_true - rss_false) * 1024 / n )) B a box of RSS"
 if [ -x $AXUM ]; then
  taskset -c 0 $AXUM --listen 127.0.0.1:18991 --threads 1 2>/tmp/rss-axum.log &
  pid=$!
  settle $pid $n "boxes $n axum + serde_json"
  echo ", boxes $(curl -s 127.0.0.1:18991/count)"
  kill $pid; wait $pid 2>/dev/null
  ax=$(( (rss - start) * 1024 / n ))
  echo "boxes $n: pollbox (rooms on) / axum, bytes a box: $per_true / $ax = $(echo "scale=3; $per_true / $ax" | bc -l)"
 fi
done
