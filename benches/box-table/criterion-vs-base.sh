#!/usr/bin/env bash
# The box-table criterion bench (benches/criterion/boxes.rs) on a base commit
# (default: 953cc8d, the table before seqlock slots, foldhash and lazy rendering)
# and on this tree, one right after the other, raw output of both in one file.
#
#   benches/box-table/criterion-vs-base.sh [BASE=953cc8d] [OUT=benches/box-table/results/DATE-criterion-vs-BASE.txt]
#
# The base's tree is exported with `git archive` into a temporary directory and built
# into this tree's target/ (only the workspace crates rebuild). Criterion prints each
# bench of the second run against the first where the names match (its "change:"
# lines).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
base=${1:-953cc8d}
out=${2:-benches/box-table/results/$(date +%F)-criterion-vs-$base.txt}
args=(--warm-up-time 1 --measurement-time 3)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
git archive "$base" | tar -x -C "$tmp"
tree="$(git rev-parse --short HEAD)$(git diff --quiet || echo '+dirty')"
{
  echo "# $(date -u +%FT%TZ) $(nproc) CPUs, load: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "# base $base (git archive), then this tree $tree"
  echo "## base $base"
  (cd "$tmp" && CARGO_TARGET_DIR="$root/target" cargo bench -q -p pollbox-benches --bench boxes -- "${args[@]}" 2>&1)
  echo "## this tree"
  cargo bench -q -p pollbox-benches --bench boxes -- "${args[@]}" 2>&1
  echo "# end $(date -u +%FT%TZ), load: $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee "$out"
