#!/usr/bin/env bash
# A delta snapshot's walk (1 % of the boxes changed) against the table's size,
# on a base commit and on this tree, side by side:
#
#   benches/box-table/delta-walk.sh [BASE] [SIZES="1000000 10000000"] [PERCENT=1]
#
# benches/box-table/delta_walk.rs (the `delta_walk` example of pollbox-benches)
# uses only the table's public API, so the same file is built against the base's
# tree (exported with `git archive`, into a target dir of its own). Each run
# prints three walks; both builds on core 0 (taskset), alternated by size.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
base=${1:-}
sizes=${2:-1000000 10000000}
percent=${3:-1}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cargo build -q --release -p pollbox-benches --example delta_walk
cp target/release/examples/delta_walk "$tmp/new"
if [[ -n $base ]]; then
  git archive "$base" | tar -x -C "$tmp/"
  cp benches/box-table/delta_walk.rs "$tmp/benches/box-table/"
  grep -q 'name = "delta_walk"' "$tmp/benches/Cargo.toml" ||
    printf '\n[[example]]\nname = "delta_walk"\npath = "box-table/delta_walk.rs"\n' >>"$tmp/benches/Cargo.toml"
  (cd "$tmp" && CARGO_TARGET_DIR="$root/target/delta-walk-base" cargo build -q --release -p pollbox-benches --example delta_walk)
  cp target/delta-walk-base/release/examples/delta_walk "$tmp/base"
fi
echo "# delta walks, $percent % changed; this tree $(git rev-parse --short HEAD)$(git diff --quiet || echo '+dirty')${base:+, base $base}"
for n in $sizes; do
  for which in ${base:+base} new; do
    taskset -c 0 "$tmp/$which" "$n" "$percent" | sed "s/^/$which /"
  done
done
