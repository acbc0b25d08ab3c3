#!/usr/bin/env bash
# Instructions per box created, removed, updated and walked under callgrind, on a base
# commit and on this tree, side by side:
#
#   benches/box-table/churn-callgrind.sh [BASE=HEAD~1] [N=100000]
#
# crates/table/examples/box_churn.rs only uses the table's public API, so the
# same file is built against the base's tree (exported with `git archive`,
# built into a target dir of its own). Counted: the `measured` function, N
# operations on a table of 100,000 boxes in 100 rooms (rooms on); per
# operation is the total over N (walk: per box walked, its poll included).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
base=${1:-HEAD~1}
n=${2:-100000}
command -v valgrind >/dev/null || { apt-get update -qq && apt-get install -y -qq valgrind; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
git archive "$base" | tar -x -C "$tmp/"
mkdir -p "$tmp/crates/table/examples"
cp crates/table/examples/box_churn.rs "$tmp/crates/table/examples/"
(cd "$tmp" && CARGO_TARGET_DIR="$root/target/box-churn-base" cargo build -q --release -p pollbox-table --example box_churn)
cp target/box-churn-base/release/examples/box_churn "$tmp/box_churn_base"
cargo build -q --release -p pollbox-table --example box_churn
cp target/release/examples/box_churn "$tmp/box_churn_new"
echo "# instructions per operation (callgrind), N=$n on 100,000 boxes; base $(git rev-parse --short "$base"), this tree $(git rev-parse --short HEAD)$(git diff --quiet || echo '+dirty')"
printf "%-8s %10s %10s %8s\n" mode base new new/base
for mode in create remove update walk; do
  for which in base new; do
    valgrind --tool=callgrind --toggle-collect='box_churn::measured' \
      --callgrind-out-file="$tmp/$which-$mode.out" "$tmp/box_churn_$which" "$mode" "$n" \
      >/dev/null 2>"$tmp/$which-$mode.log"
  done
  b=$(awk -v n="$n" '/Collected/ {print $4 / n}' "$tmp/base-$mode.log")
  a=$(awk -v n="$n" '/Collected/ {print $4 / n}' "$tmp/new-$mode.log")
  printf "%-8s %10.0f %10.0f %8.3f\n" "$mode" "$b" "$a" "$(echo "$a / $b" | bc -l)"
done
