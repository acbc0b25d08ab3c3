#!/usr/bin/env python3
"""Summarise benches/event-streams/vs-nchan.sh's JSON lines: medians over runs, one table per op."""
import json
import statistics
import sys
from collections import defaultdict


def main(path):
    rows = []
    with open(path) as f:
        for line in f:
            if line.startswith("{"):
                rows.append(json.loads(line))
    fan = defaultdict(list)
    for r in rows:
        if r["op"] == "fanout":
            fan[r["target"]].append(r)
    med = lambda rs, k: statistics.median(r[k] for r in rs)
    if fan:
        print(f"fan-out ({fan[next(iter(fan))][0]['subscribers']} subscribers, medians of {len(next(iter(fan.values())))} runs)")
        print(f"{'target':20} {'last p50 ms':>12} {'answer p50 ms':>14} {'CPU µs/dlv':>11} {'user':>6} {'system':>7}")
        for t, rs in fan.items():
            print(f"{t:20} {med(rs, 'last_delivery_us_p50') / 1000:12.2f} {med(rs, 'publisher_answer_us_p50') / 1000:14.3f} "
                  f"{med(rs, 'cpu_us_per_delivery'):11.2f} {med(rs, 'user_us_per_delivery'):6.2f} {med(rs, 'system_us_per_delivery'):7.2f}")
    singles = [r for r in rows if r["op"] == "single"]
    if singles:
        print("\none subscriber (publish-to-delivery, kernel receive timestamp)")
        print(f"{'target':20} {'p50 µs':>8} {'p90 µs':>8} {'answer p50 µs':>14}")
        for r in singles:
            print(f"{r['target']:20} {r['delivery_us_p50']:8.0f} {r['delivery_us_p90']:8.0f} {r['publisher_answer_us_p50']:14.0f}")
    mem = [r for r in rows if r["op"] == "memory"]
    if mem:
        print("\nmemory per open stream (10,000 streams on 1,000 keys)")
        print(f"{'target':20} {'streams':>8} {'RSS B/stream':>13} {'accounted B/stream':>19}")
        for r in mem:
            acc = r.get("accounted_per_stream")
            print(f"{r['target']:20} {r['streams']:8} {r['rss_per_stream']:13.0f} {'' if acc is None else f'{acc:.0f}':>19}")
    slow = [r for r in rows if r["op"] == "slow"]
    if slow:
        print("\na subscriber that never reads: updates to its key (at most 60 s of publishing)")
        print(f"{'target':20} {'updates':>8} {'publish s':>9} {'server CPU s':>12} {'RSS before':>11} {'RSS after':>10} {'delta':>8} {'accounted before/after':>23} "
              f"{'server Send-Q':>14} {'coalesced':>10} {'read later':>11} {'newest read':>12}")
        for r in slow:
            acc = f"{r['accounted_before']:.0f}/{r['accounted_after']:.0f}" if "accounted_before" in r else ""
            newest = f"{r.get('last_version_read')}/{r.get('newest_version_published')}"
            print(f"{r['target']:20} {r['updates']:8} {r['publish_s']:9.1f} {r.get('server_cpu_s', 0):12.2f} {r['rss_before']:11} {r['rss_after']:10} {r['rss_delta']:8} {acc:>23} "
                  f"{r.get('server_send_q', ''):>14} {r.get('coalesced', ''):>10} {r.get('events_read_after', ''):>11} {newest:>12}")


if __name__ == "__main__":
    main(sys.argv[1])
