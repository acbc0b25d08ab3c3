#!/usr/bin/env bash
# Run every fuzz target for SECONDS each (default 60), one after the other.
#
#   cargo install cargo-fuzz        # once; needs a nightly toolchain
#   fuzz/run.sh 60
#
# Each target starts from its committed seeds (fuzz/seeds/<target>) and keeps
# what it learns in fuzz/corpus/<target> (git-ignored), so a later run resumes
# from there. New inputs are written to the corpus directory only; the seeds are
# never modified. A crash leaves its input in fuzz/artifacts/<target>/ and
# makes this script exit non-zero; replay it with
#   cargo +nightly fuzz run <target> fuzz/artifacts/<target>/crash-...
# Set FUZZ_TARGETS="framing" to run a subset, FUZZ_TOOLCHAIN to pick another
# nightly.
set -euo pipefail

seconds="${1:-60}"
toolchain="${FUZZ_TOOLCHAIN:-nightly}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

targets="${FUZZ_TARGETS:-framing projection projection_diff auth wal order}"
logdir="fuzz/target/logs"   # git-ignored with the build
mkdir -p "$logdir"

status=0
for target in $targets; do
    mkdir -p "fuzz/corpus/$target"
    log="$logdir/$target.log"
    echo "== fuzz $target for ${seconds}s (log: $log)"
    if cargo "+$toolchain" fuzz run "$target" "fuzz/corpus/$target" "fuzz/seeds/$target" -- \
        -max_total_time="$seconds" -print_final_stats=1 >"$log" 2>&1; then
        result=ok
    else
        result=FAILED
        status=1
    fi
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    time_s=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$log" | tail -1)
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 || true)
    if [[ -n "${runs:-}" && -n "${time_s:-}" && "$time_s" -gt 0 ]]; then
        rate=$((runs / time_s))
    else
        rate="?"
    fi
    echo "   $target: $result, ${runs:-?} runs in ${time_s:-?} s, ${rate} exec/s, ${cov:-cov: ?}"
    if [[ $result == FAILED ]]; then
        grep -m1 -A8 'panicked at\|ERROR: libFuzzer' "$log" || tail -40 "$log"
        ls "fuzz/artifacts/$target" 2>/dev/null | sed 's/^/   artifact: /'
    fi
done
exit $status
