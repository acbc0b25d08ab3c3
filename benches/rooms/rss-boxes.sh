#!/bin/bash
# benches/rooms/rss-boxes.sh: RSS with 100,000 and 1,000,000 boxes (one 512 B message each,
# `pollbox load --preseed`), boxes.rooms = true and false; server on CPU 0, load on CPU 1.
# RSS with N boxes (one 512 B message each), boxes.rooms on and off.
cd "$(dirname "$0")/../.."
for n in 100000 1000000; do
 for rooms in true false; do
  cfg=/tmp/rss-$rooms.toml
  cp config/pollbox.toml $cfg
  sed -i "s/^rooms = .*/rooms = $rooms                # (bench)/" $cfg
  sed -i 's/^listen = .*/listen = "127.0.0.1:18991"/' $cfg
  taskset -c 0 ./target/release/pollbox serve --config $cfg > /tmp/rss-server.log 2>&1 &
  pid=$!
  sleep 1
  taskset -c 1 ./target/release/pollbox load --url http://127.0.0.1:18991 --preseed --keys $n --duration 1 > /tmp/rss-load.log 2>&1
  sleep 6
  rss=$(awk '/VmRSS/{print $2}' /proc/$pid/status)
  boxes=$(curl -s 127.0.0.1:18991/metrics | awk '/^pollbox_boxes /{print $2}')
  acc=$(curl -s 127.0.0.1:18991/metrics | awk '/^pollbox_accounted_bytes\{part="boxes"\}/{print $2}')
  echo "boxes $n rooms=$rooms: RSS $((rss/1024)) MiB ($rss kB), pollbox_boxes $boxes, accounted boxes $acc B"
  kill $pid; wait $pid 2>/dev/null
 done
done
