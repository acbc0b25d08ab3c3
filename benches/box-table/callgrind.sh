#!/usr/bin/env bash
# Instructions per box-table operation under callgrind (noise-free on a shared
# machine), on a base commit and on this tree, side by side:
#
#   benches/box-table/callgrind.sh [BASE=953cc8d] [N=100000]
#
# benches/box-table/box_ops.rs (the `box_ops` example of pollbox-benches) only
# uses the table's public API, so the same file is built against the base's tree
# (exported with `git archive`, built into this tree's target/ and copied aside).
# Counted: the `measured` function, which runs a 20,000-operation warm-up and
# then N operations, so per operation is the total over N + 20,000.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
base=${1:-953cc8d}
n=${2:-100000}
command -v valgrind >/dev/null || { apt-get update -qq && apt-get install -y -qq valgrind; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
git archive "$base" | tar -x -C "$tmp/"
# Where the base's pollbox-benches keeps the example: box-table/ since the
# benches were arranged by measurement, examples/ (found by name) before.
if [[ -e "$tmp/benches/box-table/box_ops.rs" ]]; then
  cp benches/box-table/box_ops.rs "$tmp/benches/box-table/"
else
  mkdir -p "$tmp/benches/examples"
  cp benches/box-table/box_ops.rs "$tmp/benches/examples/"
fi
# A target dir of its own: sharing this tree's lets cargo take the base's
# sources (older mtimes from `git archive`) for fresh and reuse this tree's build.
(cd "$tmp" && CARGO_TARGET_DIR="$root/target/box-ops-base" cargo build -q --release -p pollbox-benches --example box_ops)
cp target/box-ops-base/release/examples/box_ops "$tmp/box_ops_base"
cargo build -q --release -p pollbox-benches --example box_ops
cp target/release/examples/box_ops "$tmp/box_ops_new"
echo "# instructions per operation (callgrind), N=$n; base $base, this tree $(git rev-parse --short HEAD)$(git diff --quiet || echo '+dirty')"
printf "%-16s %10s %10s %8s\n" mode base new new/base
for mode in poll version apply apply_lazy apply_poll_1 apply_poll_10 apply_poll_100; do
  for which in base new; do
    valgrind --tool=callgrind --toggle-collect='box_ops::measured' \
      --callgrind-out-file="$tmp/$which-$mode.out" "$tmp/box_ops_$which" "$mode" "$n" \
      >/dev/null 2>"$tmp/$which-$mode.log"
  done
  b=$(awk -v n="$n" '/Collected/ {print $4 / (n + 20000)}' "$tmp/base-$mode.log")
  a=$(awk -v n="$n" '/Collected/ {print $4 / (n + 20000)}' "$tmp/new-$mode.log")
  printf "%-16s %10.0f %10.0f %8.2f\n" "$mode" "$b" "$a" "$(echo "$a / $b" | bc -l)"
done
