#!/usr/bin/env bash
# Instructions per record the consuming thread spends in `Replica::apply`
# (callgrind: noise-free on a shared machine), this tree beside a base commit,
# with benches/log/replica_apply.rs built against both. The base may predate
# the home-partition rule: there the example's partition argument and
# `home_partition` call are edited out (its Replica::new took two arguments),
# and so is the `Watchers` argument of `Replica::apply` where it had none.
#
#   benches/log/callgrind.sh [BASE=b451268] [N=100000]
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
base=${1:-b451268}
n=${2:-100000}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
git archive "$base" | tar -x -C "$tmp/"
cp benches/log/replica_apply.rs "$tmp/benches/log/"
if ! grep -q "pub fn home_partition" -r "$tmp/crates/"; then
  sed -i -e 's/Replica::new(plan, 64 << 20, PARTITIONS)/Replica::new(plan, 64 << 20)/' \
    -e 's/pollbox_core::log::home_partition(key.as_bytes(), PARTITIONS)/0/' \
    "$tmp/benches/log/replica_apply.rs"
fi
if ! grep -q "watchers: &mut impl Watchers" -r "$tmp/crates/"; then
  # A base whose apply woke nobody itself (no Watchers argument).
  sed -i 's/replica.apply(table, &rec, &mut key, &mut ())/replica.apply(table, \&rec, \&mut key)/' \
    "$tmp/benches/log/replica_apply.rs"
fi
grep -q 'name = "replica_apply"' "$tmp/benches/Cargo.toml" ||
  printf '\n[[example]]\nname = "replica_apply"\npath = "log/replica_apply.rs"\n' >>"$tmp/benches/Cargo.toml"
(cd "$tmp" && CARGO_TARGET_DIR="$root/target/replica-base" cargo build -q --release -p pollbox-benches --example replica_apply)
cp target/replica-base/release/examples/replica_apply "$tmp/base"
cargo build -q --release -p pollbox-benches --example replica_apply
cp target/release/examples/replica_apply "$tmp/new"
echo "# instructions per record in Replica::apply (callgrind), N=$n; base $base, this tree $(git rev-parse --short HEAD)$(git diff --quiet || echo '+dirty')"
for which in base new; do
  valgrind --tool=callgrind --toggle-collect='replica_apply::measured' \
    --callgrind-out-file="$tmp/$which.out" "$tmp/$which" "$n" >/dev/null 2>&1
  ir=$(callgrind_annotate "$tmp/$which.out" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
  [[ -n "$ir" ]] || { echo "callgrind of $which failed" >&2; exit 1; }
  echo "$which $ir $((ir / (n + 20000)))"
done | awk '{v[$1] = $3; print $1 ": " $3 " instructions per record (" $2 " in all)"}
  END {printf "new/base: %.4f\n", v["new"] / v["base"]}'
