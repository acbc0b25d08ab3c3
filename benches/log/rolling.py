#!/usr/bin/env python3
"""Helpers of benches/log/rolling.sh (standard library only).

  rolling.py ingest URL RATE KEYS OUT STOPFILE
      POST /v1/boxes/chk-<i> at RATE/s over KEYS keys (4 threads, keep-alive,
      no retries) until STOPFILE exists; writes per key how many were sent and
      acknowledged (200), and every other answer, to OUT (JSON).
  rolling.py haproxy-up SOCKET SERVER
      exit 0 when HAProxy (stats socket SOCKET) has backend server SERVER UP.
  rolling.py haproxy-idle SOCKET SERVER
      exit 0 when no request is in flight on SERVER.
  rolling.py haproxy SOCKET COMMAND
      a command on the stats socket (e.g. "set server pollbox/node1 state drain").
  rolling.py verify OUT INGEST_JSON SLICES_DIR KEYS NODE_URL...
      on every node: n of each chk key >= its acknowledged count, and the n of
      the load generator's keys (lg-0..lg-KEYS-1) summed >= the 200s the
      generator's ingests got; writes the result to OUT (JSON), prints it.
  rolling.py report EVENTS SLICES_DIR CHECK_JSON HAPROXY_LOG
      the summary: totals, failures by code, p99 of ingest and poll in every
      restart window (of the generator's slices that overlap it), losses.
"""
import json
import os
import socket
import sys
import threading
import time
import http.client
import urllib.request
from collections import Counter, defaultdict


def ingest(url, rate, keys, out, stopfile):
    host, port = url.split("//", 1)[1].split(":")
    rate, keys = float(rate), int(keys)
    threads = 4
    sent = Counter()
    acked = Counter()
    answers = Counter()
    odd = []  # (unix time, key, outcome, body) of the first 200 answers that were not 200
    lock = threading.Lock()

    def worker(w):
        conn = None
        interval = threads / rate
        nxt = time.monotonic() + w * interval / threads
        i = w
        while not os.path.exists(stopfile):
            now = time.monotonic()
            if nxt > now:
                time.sleep(nxt - now)
            nxt += interval
            key = f"chk-{i % keys}"
            i += threads
            body = json.dumps({"value": 1, "player": "chk"})
            outcome = None
            text = ""
            try:
                if conn is None:
                    conn = http.client.HTTPConnection(host, int(port), timeout=15)
                conn.request("POST", f"/v1/boxes/{key}", body, {"Content-Type": "application/json"})
                r = conn.getresponse()
                text = r.read()[:120].decode("utf-8", "replace")
                outcome = str(r.status)
                if r.getheader("Connection", "").lower() == "close":
                    conn.close()
                    conn = None
            except ConnectionRefusedError:
                outcome = "refused"
                conn = None
            except socket.timeout:
                outcome = "timeout"
                conn.close()
                conn = None
            except (http.client.HTTPException, OSError) as e:
                outcome = type(e).__name__
                if conn is not None:
                    conn.close()
                conn = None
            with lock:
                sent[key] += 1
                answers[outcome] += 1
                if outcome == "200":
                    acked[key] += 1
                elif len(odd) < 200:
                    odd.append((round(time.time(), 3), key, outcome, text))

    ts = [threading.Thread(target=worker, args=(w,)) for w in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    with open(out, "w") as f:
        json.dump({"sent": sent, "acked": acked, "answers": answers, "odd": odd}, f)


def haproxy_cmd(sock_path, cmd):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(2)
    s.connect(sock_path)
    s.sendall(cmd.encode() + b"\n")
    data = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    return data.decode()


def haproxy_server(sock_path, server):
    lines = haproxy_cmd(sock_path, "show stat").splitlines()
    head = lines[0].lstrip("# ").split(",")
    for line in lines[1:]:
        row = dict(zip(head, line.split(",")))
        if row.get("pxname") == "pollbox" and row.get("svname") == server:
            return row
    return {}


def haproxy_up(sock_path, server):
    sys.exit(0 if haproxy_server(sock_path, server).get("status") == "UP" else 1)


def haproxy_idle(sock_path, server):
    """exit 0 when HAProxy has no request of SERVER's in flight."""
    sys.exit(0 if haproxy_server(sock_path, server).get("scur") == "0" else 1)


def get_json(url):
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return None
        raise


def slice_ingest_200s(slices_dir):
    total = 0
    for name in os.listdir(slices_dir):
        if name.endswith(".json"):
            with open(os.path.join(slices_dir, name)) as f:
                rep = json.load(f)
            for op in rep["ops"]:
                if op["op"] == "ingest":
                    total += op["status"].get("200", 0)
    return total


def verify(out, ingest_json, slices_dir, keys, *nodes):
    with open(ingest_json) as f:
        chk = json.load(f)
    acked, sent = chk["acked"], chk["sent"]
    gen_acked = slice_ingest_200s(slices_dir)
    keys = int(keys)
    result = {"chk_keys": len(sent), "chk_sent": sum(sent.values()), "chk_acked": sum(acked.values()),
              "gen_acked": gen_acked, "nodes": {}}
    for node in nodes:
        short = []  # chk keys with n < acknowledged
        over = []   # n > sent: applied more than was ever sent (must not happen)
        n_chk = 0
        for key, s in sorted(sent.items()):
            box = get_json(f"{node}/v1/boxes/{key}")
            n = box["n"] if box else 0
            n_chk += n
            if n < acked.get(key, 0):
                short.append((key, n, acked.get(key, 0)))
            if n > s:
                over.append((key, n, s))
        n_gen = 0
        names = [f"lg-{i}" for i in range(keys)]
        for i in range(0, len(names), 64):
            boxes = get_json(f"{node}/v1/boxes?keys={','.join(names[i:i + 64])}")
            n_gen += sum(b["n"] for b in boxes if b)
        result["nodes"][node] = {"chk_n": n_chk, "chk_short": short, "chk_over": over,
                                 "gen_n": n_gen, "gen_short": max(0, gen_acked - n_gen)}
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result, indent=1))


def hgrm_points(path):
    """(value ms, count) increments of an HdrHistogram percentile file."""
    pts, last = [], 0
    try:
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) == 4 and not line.startswith("#"):
                    try:
                        v, c = float(parts[0]), int(parts[2])
                    except ValueError:
                        continue
                    if c > last:
                        pts.append((v, c - last))
                        last = c
    except FileNotFoundError:
        pass
    return pts


def quantile(points, q):
    total = sum(c for _, c in points)
    if total == 0:
        return None
    want, seen = q * total, 0
    for v, c in sorted(points):
        seen += c
        if seen >= want:
            return v
    return max(v for v, _ in points)


OK_CODES = {"200", "204", "304", "404"}


def report(events_path, slices_dir, check_json, haproxy_log):
    # Windows: "name<TAB>start<TAB>end" (epoch seconds).
    windows = []
    with open(events_path) as f:
        for line in f:
            name, a, b = line.rstrip("\n").split("\t")[:3]
            windows.append((name, float(a), float(b)))
    slices = []
    with open(os.path.join(slices_dir, "starts")) as f:
        for line in f:
            k, t = line.split()
            slices.append((k, float(t)))
    slice_len = float(os.environ.get("SLICE", "2"))

    total = Counter()
    fail_codes = Counter()
    version_errors = 0
    unanswered_why = Counter()
    rows = []
    per_slice = {}
    for k, t in slices:
        path = os.path.join(slices_dir, f"{k}.json")
        if not os.path.exists(path):
            rows.append(f"slice {k}: no report ({open(os.path.join(slices_dir, k + '.out')).read()[-300:]!r})")
            continue
        with open(path) as f:
            rep = json.load(f)
        s = {"t": t, "ops": {}, "fail": Counter()}
        for op in rep["ops"]:
            name = op["op"]
            answered = op["requests"]
            total[name] += answered + op["unanswered"]
            bad = {c: n for c, n in op["status"].items() if c not in OK_CODES}
            for c, n in bad.items():
                fail_codes[f"{name} {c}"] += n
                s["fail"][c] += n
            if op["unanswered"]:
                fail_codes[f"{name} unanswered"] += op["unanswered"]
                s["fail"]["unanswered"] += op["unanswered"]
            s["ops"][name] = op
        for kind, n in rep.get("errors", {}).items():
            if kind == "version":
                version_errors += n
            elif kind in ("closed", "io", "timeout"):  # why requests went unanswered (counted above)
                unanswered_why[kind] += n
            elif kind != "status":  # a status: counted by code above
                fail_codes[f"error {kind}"] += n
                s["fail"][kind] += n
        per_slice[k] = s
        ing, pol = s["ops"].get("ingest", {}), s["ops"].get("poll", {})
        rows.append(
            f"slice {k:>3} t+{t - slices[0][1]:6.1f}s ingest {ing.get('requests', 0):5d} "
            f"p99 {ing.get('latency_ms', {}).get('p99', 0):8.2f} ms  poll {pol.get('requests', 0):5d} "
            f"p99 {pol.get('latency_ms', {}).get('p99', 0):8.2f} ms  status {dict(rep['status'])} "
            f"errors {dict(rep.get('errors', {}))}")

    requests = sum(total.values())
    failed = sum(fail_codes.values())
    out = []
    out.append("== per slice (the load generator's own numbers) ==")
    out += rows
    out.append("")
    out.append("== summary ==")
    out.append(f"requests: {requests} ({', '.join(f'{op} {n}' for op, n in sorted(total.items()))})")
    share = 100.0 * failed / requests if requests else 0.0
    verdict = "ok" if share <= 0.1 else "ABOVE the 0.1 % goal"
    out.append(f"failed: {failed} = {share:.3f} % ({verdict})")
    for code, n in sorted(fail_codes.items()):
        ok = code.endswith(" 503") or code == "error connect"
        out.append(f"  {code}: {n}{'' if ok else '  <- neither a 503 nor a refused connection'}")
    if unanswered_why:
        out.append(f"  (unanswered, by why: {dict(unanswered_why)}: closed = the connection closed while "
                   f"waiting, timeout = no answer by the end of the run's 7-s drain, i.e. the generator's schedule fell behind)")
    out.append(f"versions going backwards on a connection (a poll reaching a node that had not applied "
               f"what another served yet: replica lag, not a failure): {version_errors}")
    out.append("")
    out.append("== restart windows (generator slices overlapping each; p99 in ms) ==")
    out.append(f"{'window':<22}{'seconds':>8}{'ingest':>9}{'p99':>9}{'poll':>9}{'p99':>9}{'failed':>8}  codes")
    for name, a, b in windows:
        ks = [k for k, t in slices if t < b and t + slice_len > a and k in per_slice]
        pts = {"ingest": [], "poll": []}
        n = Counter()
        fails = Counter()
        for k in ks:
            for op in ("ingest", "poll"):
                pts[op] += hgrm_points(os.path.join(slices_dir, f"{k}.{op}.hgrm"))
                n[op] += per_slice[k]["ops"].get(op, {}).get("requests", 0)
            fails += per_slice[k]["fail"]
        p = {op: quantile(pts[op], 0.99) for op in pts}
        fmt = lambda v: f"{v:9.2f}" if v is not None else f"{'-':>9}"
        out.append(f"{name:<22}{b - a:8.1f}{n['ingest']:9d}{fmt(p['ingest'])}{n['poll']:9d}{fmt(p['poll'])}"
                   f"{sum(fails.values()):8d}  {dict(fails)}")
    out.append("")
    with open(check_json) as f:
        chk = json.load(f)
    out.append("== acknowledged messages lost? ==")
    out.append(f"checker (POST /v1/boxes/chk-*, no retries): {chk['chk_sent']} sent, "
               f"{chk['chk_acked']} answered 200, over {chk['chk_keys']} keys")
    out.append(f"load generator: {chk['gen_acked']} ingests answered 200 over its lg-* keys")
    lost = False
    for node, r in chk["nodes"].items():
        out.append(f"  {node}: chk keys with n < acknowledged: {len(r['chk_short'])} {r['chk_short'][:5]}; "
                   f"n > sent: {len(r['chk_over'])}; lg-* keys: sum n {r['gen_n']} vs 200s {chk['gen_acked']} "
                   f"(short {r['gen_short']})")
        lost |= bool(r["chk_short"]) or r["gen_short"] > 0
    out.append("lost: " + ("YES" if lost else "none"))
    try:
        with open(haproxy_log) as f:
            lines = [line for line in f if '"' in line]
        out.append("")
        out.append(f"== HAProxy: {len(lines)} abnormal requests logged (option dontlog-normal); by status and "
                   f"termination state ==")
        c = Counter()
        for line in lines:
            parts = line.split()
            # ... frontend backend/server timers STATUS BYTES - - TERMSTATE ...
            for i, p in enumerate(parts):
                if "/" in p and i + 2 < len(parts) and parts[i + 1].count("/") == 4:
                    c[f"{parts[i + 2]} {parts[i + 6] if i + 6 < len(parts) else '?'} {p}"] += 1
                    break
        for k, n in c.most_common():
            out.append(f"  {n:6d}  {k}")
    except FileNotFoundError:
        pass
    print("\n".join(out))


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    {"ingest": ingest, "haproxy-up": haproxy_up, "haproxy-idle": haproxy_idle,
     "haproxy": lambda sock, c: print(haproxy_cmd(sock, c), end=""),
     "verify": verify, "report": report}[cmd](*args)
