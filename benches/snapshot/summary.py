#!/usr/bin/env python3
"""The table of benches/snapshot/run.sh and floor.sh: WORK REPS BASE MODE.

Reads WORK/{BASE,MODE}-{1..REPS}.json (pollbox load reports); prints each pair's
p99 ratio, each run, and the medians of the two modes with their ratio.
"""
import json
import statistics
import sys

work, reps, base, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
runs = {m: [json.load(open(f"{work}/{m}-{rep}.json")) for rep in range(1, reps + 1)] for m in (base, mode)}
for rep, (a, b) in enumerate(zip(runs[base], runs[mode]), 1):
    pa, pb = a["latency_ms"]["p99"] * 1000, b["latency_ms"]["p99"] * 1000
    print(f"pair {rep}: p99 {base} {pa:.1f} us, {mode} {pb:.1f} us, ratio {pb / pa:.2f}x")
print(f"{'mode':<10} {'run':>3} {'req/s':>9} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'p99.9 ms':>9} {'errors':>6}")
med = {}
for m in (base, mode):
    for rep, j in enumerate(runs[m], 1):
        l = j["latency_ms"]
        print(f"{m:<10} {rep:>3} {j['achieved_rate']:>9.0f} {l['p50']:>8.3f} {l['p90']:>8.3f} "
              f"{l['p99']:>8.3f} {l['p999']:>9.3f} {j['errors_total']:>6}")
    med[m] = {q: statistics.median(j["latency_ms"][q] for j in runs[m]) for q in ("p50", "p90", "p99", "p999")}
for q in ("p50", "p90", "p99", "p999"):
    print(f"median {q}: {base} {med[base][q]:.3f} ms, {mode} {med[mode][q]:.3f} ms, "
          f"ratio {med[mode][q] / med[base][q]:.2f}x")
