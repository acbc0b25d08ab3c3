#!/usr/bin/env python3
"""Walk every page of a prefix, again and again, and check each walk (stdlib only).

  walk.py --url http://127.0.0.1:PORT --prefix room-3/ --limit 1000 --expect 100000 --seconds 15

Each walk follows `next` from the first page (GET /v1/boxes?prefix=P&limit=N) to
the last (`"next":null`) over one keep-alive connection, and asserts: every box's
key is under the prefix, keys come in strictly increasing byte order across the
whole walk (so none is seen twice), each page holds at most `limit` boxes, and
the walk saw exactly `--expect` boxes (no box is created or deleted during the
runs this is used in). A failed check exits with status 1. Walks go on back to
back (or one starts every `--every` seconds) until `--seconds` have passed (at
least one walk). Prints one JSON line:
walks, pages, boxes, page latency percentiles (ms) and boxes read a second.
"""
import argparse
import http.client
import json
import re
import sys
import time
import urllib.parse

BOX_KEY = re.compile(rb'\{"k":"((?:[^"\\]|\\.)*)"')
NEXT = re.compile(rb'"next":(?:null|"([0-9a-f]*)")')


def walk(conn, prefix, limit, latencies):
    keys_seen = 0
    pages = 0
    last = None
    cursor = None
    q = urllib.parse.quote(prefix, safe="")
    while True:
        path = f"/v1/boxes?prefix={q}&limit={limit}"
        if cursor is not None:
            path += f"&cursor={cursor}"
        t0 = time.perf_counter()
        conn.request("GET", path)
        r = conn.getresponse()
        body = r.read()
        latencies.append(time.perf_counter() - t0)
        if r.status != 200:
            fail(f"page {pages} answered {r.status}: {body[:200]!r}")
        pages += 1
        keys = BOX_KEY.findall(body)
        if len(keys) > limit:
            fail(f"page {pages} holds {len(keys)} boxes, limit {limit}")
        for k in keys:
            if not k.startswith(prefix.encode()):
                fail(f"key {k!r} is not under {prefix!r}")
            if last is not None and k <= last:
                fail(f"key {k!r} after {last!r}: out of order or seen twice")
            last = k
        keys_seen += len(keys)
        m = NEXT.search(body, max(0, len(body) - 200))
        if not m:
            fail(f"page {pages} has no next: {body[-200:]!r}")
        if m.group(1) is None:
            return keys_seen, pages
        cursor = m.group(1).decode()


def fail(why):
    print(f"walk.py: FAILED: {why}", file=sys.stderr)
    sys.exit(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--prefix", required=True)
    ap.add_argument("--limit", type=int, default=1000)
    ap.add_argument("--expect", type=int, required=True)
    ap.add_argument("--seconds", type=float, default=0)
    ap.add_argument("--every", type=float, default=0)
    a = ap.parse_args()
    u = urllib.parse.urlparse(a.url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    latencies = []
    walks = pages = boxes = 0
    start = time.perf_counter()
    while True:
        began = time.perf_counter()
        n, p = walk(conn, a.prefix, a.limit, latencies)
        if n != a.expect:
            fail(f"walk {walks + 1} saw {n} boxes, expected {a.expect}")
        walks += 1
        pages += p
        boxes += n
        if time.perf_counter() - start >= a.seconds:
            break
        if a.every > 0:
            time.sleep(max(0.0, began + a.every - time.perf_counter()))
    took = time.perf_counter() - start
    latencies.sort()
    pct = lambda q: round(1e3 * latencies[min(len(latencies) - 1, int(q * len(latencies)))], 3)
    print(json.dumps({
        "walks": walks, "pages": pages, "boxes": boxes, "seconds": round(took, 2),
        "boxes_per_s": round(boxes / took), "every_walk": f"{a.expect} unique keys in order",
        "page_ms": {"p50": pct(0.5), "p99": pct(0.99), "max": round(1e3 * latencies[-1], 3)},
    }))


if __name__ == "__main__":
    main()
