#!/usr/bin/env python3
"""Many boxes on one connection against one box a connection (Python stdlib only).

Each part starts its own pollbox (one worker, pinned to CPU 0 with taskset) and
drives it from this process (run it on CPU 1: `taskset -c 1 python3 ...`).
The boxes are box-00 .. box-63, seeded with one message each.

  many.py memory --bin B [--streams 6400 --reps 2]
      Fresh server per measurement. N event streams that each watch all 64 boxes
      (`GET /v1/boxes?keys=box-00,...,box-63`) against N streams of one box
      each (box-(i % 64)): the server's RSS, accounted bytes (pollbox_accounted_bytes,
      by part) and jemalloc allocated bytes before and with the streams open, per
      stream; again after one update to every box. Alternated, `--reps` each.
  many.py events --bin B [--subs 1000 --rate 20 --seconds 5 --reps 7]
      Fresh server per measurement. S subscribers each with one stream of box-63
      (single) or each with one stream of all 64 boxes, box-63 last (many); a
      publisher on one keep-alive connection posts to box-63 at --rate a second.
      Server CPU (schedstat of all threads; user/system from /proc/PID/stat)
      over the publishing window divided by pollbox_sse_events_total's growth.
      A publisher with no subscribers (none) gives the publishing's own CPU,
      subtracted for the net figure. Alternated none, single, many (--kinds);
      --perf DIR: `perf record` the server over each window (benches/many/perf.sh).
  many.py interleaved --bin B [--subs 1000 --rate 20 --seconds 1 --windows 10 --reps 3]
      The same question on one server a round with both kinds open at once:
      1 s windows posting to box-64 (watched by S one-box streams) and to box-63
      (watched by S streams of box-00..box-63) alternate; box-65 (nobody) for the
      publishing's own CPU. Median of the windows' many / single ratios.
  many.py polls --bin B [--boxes 20 --conns 1 --seconds 4 --reps 3]
      One server. Closed loop on --conns keep-alive connections: a page is
      20 boxes read as one GET /v1/boxes?keys=... (many), 20 GETs one after the
      other (seq), or 20 GETs written at once (pipe); each with full answers (200)
      and with If-None-Match (304). Server CPU per page. Alternated, `--reps` each.

Prints one JSON line per measurement, then a summary of medians.
"""
import argparse
import json
import os
import selectors
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

TICK = os.sysconf("SC_CLK_TCK")
ALL = [f"box-{i:02d}" for i in range(64)]
HOT = ALL[-1]


# ------------------------------------------------------------------------------
# The server


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Server:
    def __init__(self, binary, root, max_connections=20000):
        self.port = free_port()
        self.cfg = tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False)
        with open(os.path.join(root, "config/pollbox.toml")) as f:
            text = f.read()
        text = text.replace("max_connections = 10000", f"max_connections = {max_connections}")
        self.cfg.write(text)
        self.cfg.close()
        self.log = open(os.path.join(tempfile.gettempdir(), "many-bench-serve.log"), "w")
        self.proc = subprocess.Popen(
            ["taskset", "-c", "0", binary, "serve", "--config", self.cfg.name,
             "--listen", f"127.0.0.1:{self.port}", "--workers", "1"],
            stdout=self.log, stderr=subprocess.STDOUT)
        self.pid = self.proc.pid
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.025)
        else:
            raise SystemExit("pollbox did not open its port")

    def stop(self):
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.unlink(self.cfg.name)

    def cpu_ns(self):
        total = 0
        for t in os.listdir(f"/proc/{self.pid}/task"):
            try:
                with open(f"/proc/{self.pid}/task/{t}/schedstat") as f:
                    total += int(f.read().split()[0])
            except OSError:
                pass
        return total

    def cpu_ticks(self):
        with open(f"/proc/{self.pid}/stat") as f:
            parts = f.read().rsplit(")", 1)[1].split()
        return int(parts[11]) / TICK, int(parts[12]) / TICK

    def rss(self):
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        return 0

    def metrics(self):
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10).read().decode()
        out = {"accounted": 0.0}
        for line in text.splitlines():
            if line.startswith("#"):
                continue
            name, _, value = line.rpartition(" ")
            if name.startswith("pollbox_accounted_bytes{part="):
                part = name.split('"')[1]
                out["acc_" + part] = float(value)
                out["accounted"] += float(value)
            elif name in ("pollbox_jemalloc_allocated_bytes", "pollbox_sse_events_total",
                          "pollbox_sse_coalesced_total", "pollbox_sse_subscribers",
                          "pollbox_connections_open", "pollbox_buffered_bytes"):
                out[name[len("pollbox_"):]] = float(value)
        return out

    def seed(self, keys=ALL):
        s = socket.create_connection(("127.0.0.1", self.port))
        for i, k in enumerate(keys):
            s.sendall(post(k, i))
            read_answers(s, 1)
        s.close()


def slab_kb():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("Slab:"):
                return int(line.split()[1])
    return 0


def post(key, i):
    body = json.dumps({"value": i, "player": "p-%07d" % (i % 10_000_000)}).encode()
    return (f"POST /v1/boxes/{key} HTTP/1.1\r\nHost: b\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def many_path(keys):
    return "/v1/boxes?keys=" + ",".join(keys)


def stream_req(path):
    return f"GET {path} HTTP/1.1\r\nHost: b\r\nAccept: text/event-stream\r\n\r\n".encode()


# ------------------------------------------------------------------------------
# HTTP answers with a length (polls, posts)


class Answers:
    """Incremental reader of HTTP/1.1 answers with Content-Length (or a 304)."""

    def __init__(self):
        self.buf = b""
        self.done = []  # (status, headers-bytes, body)

    def feed(self, data):
        self.buf += data
        n = 0
        while True:
            i = self.buf.find(b"\r\n\r\n")
            if i < 0:
                return n
            head = self.buf[:i + 2]
            status = int(head[9:12])
            if status == 304:
                length = 0
            else:
                j = head.find(b"Content-Length: ")
                length = int(head[j + 16:head.index(b"\r\n", j)]) if j >= 0 else 0
            if len(self.buf) < i + 4 + length:
                return n
            self.done.append((status, head[:-2], self.buf[i + 4:i + 4 + length]))
            self.buf = self.buf[i + 4 + length:]
            n += 1


def read_answers(s, n):
    a = Answers()
    while len(a.done) < n:
        data = s.recv(1 << 20)
        if not data:
            raise SystemExit("connection closed")
        a.feed(data)
    for status, head, body in a.done:
        if status >= 400:
            raise SystemExit(f"answered {status}: {head!r} {body[:200]!r}")
    return a.done


def header(head, name):
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == name:
            return v.strip().decode()
    return None


# ------------------------------------------------------------------------------
# Event streams


class Stream:
    __slots__ = ("sock", "events", "tail", "closed")

    def __init__(self, port, path, sel):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.sendall(stream_req(path))
        self.sock.setblocking(False)
        self.events = 0  # `data: ` lines seen: one an event
        self.tail = b""
        self.closed = False
        sel.register(self.sock, selectors.EVENT_READ, self)

    def read(self, sel):
        try:
            data = self.sock.recv(1 << 18)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.closed = True
            sel.unregister(self.sock)
            return
        buf = self.tail + data
        self.events += buf.count(b"data: ")
        self.tail = buf[-5:]


class Publisher:
    def __init__(self, port, sel):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.setblocking(False)
        self.answers = Answers()
        self.sent = 0
        sel.register(self.sock, selectors.EVENT_READ, self)

    def send(self, key):
        self.sock.sendall(post(key, 1000 + self.sent))
        self.sent += 1

    @property
    def answered(self):
        return len(self.answers.done)

    def read(self, sel):
        try:
            data = self.sock.recv(1 << 16)
        except BlockingIOError:
            return
        if not data:
            raise SystemExit("publisher: connection closed")
        self.answers.feed(data)
        status = self.answers.done[-1][0] if self.answers.done else 200
        if status >= 300:
            raise SystemExit(f"publish answered {status}")


def pump(sel, until=None, timeout=5.0):
    end = time.monotonic() + timeout
    while until is None or not until():
        left = end - time.monotonic()
        if left <= 0:
            return False
        for key, _ in sel.select(min(left, 0.05)):
            key.data.read(sel)
    return True


def quiet(sel, secs):
    while True:
        evs = sel.select(secs)
        if not evs:
            return
        for key, _ in evs:
            key.data.read(sel)


def open_streams(port, paths, sel, want_each, batch=200):
    streams = []
    for i, p in enumerate(paths):
        streams.append(Stream(port, p, sel))
        if i % batch == batch - 1:
            quiet(sel, 0.0)
    ok = pump(sel, lambda: all(s.events >= want_each or s.closed for s in streams), 60.0)
    closed = sum(s.closed for s in streams)
    if closed or not ok:
        got = sum(s.events >= want_each for s in streams)
        raise SystemExit(f"streams: {closed} closed, {got} of {len(streams)} got their first {want_each} events")
    return streams


def close_all(streams, sel):
    for s in streams:
        if not s.closed:
            sel.unregister(s.sock)
        s.sock.close()


# ------------------------------------------------------------------------------


def memory(a):
    out = []
    kinds = ["many", "single"]
    for rep in range(a.reps):
        for kind in kinds:
            srv = Server(a.bin, a.root)
            try:
                srv.seed()
                time.sleep(1.0)
                m0, r0, k0 = srv.metrics(), srv.rss(), slab_kb()
                sel = selectors.DefaultSelector()
                if kind == "many":
                    paths = [many_path(ALL)] * a.streams
                    want = 64
                else:
                    paths = [f"/v1/boxes/{ALL[i % 64]}" for i in range(a.streams)]
                    want = 1
                t = time.monotonic()
                streams = open_streams(srv.port, paths, sel, want)
                opened_s = time.monotonic() - t
                quiet(sel, 2.0)
                m1, r1, k1 = srv.metrics(), srv.rss(), slab_kb()
                # One update to every box: every stream gets its box(es) again.
                pub = Publisher(srv.port, sel)
                for k in ALL:
                    pub.send(k)
                    pump(sel, lambda: pub.answered >= pub.sent, 5.0)
                want2 = want * 2
                pump(sel, lambda: all(s.events >= want2 for s in streams), 60.0)
                quiet(sel, 2.0)
                m2, r2, k2 = srv.metrics(), srv.rss(), slab_kb()
                n = m1["sse_subscribers"] - m0["sse_subscribers"]
                row = {
                    "op": "memory", "kind": kind, "rep": rep + 1, "streams": a.streams,
                    "keys_per_stream": 64 if kind == "many" else 1,
                    "subscribers": n, "open_s": round(opened_s, 2),
                    "events_open": sum(s.events for s in streams) - 0,
                    "rss_before": r0, "rss_open": r1, "rss_updated": r2,
                    "rss_per_stream": round((r1 - r0) / n),
                    "rss_per_stream_updated": round((r2 - r0) / n),
                    "accounted_per_stream": round((m1["accounted"] - m0["accounted"]) / n),
                    "accounted_per_stream_updated": round((m2["accounted"] - m0["accounted"]) / n),
                    "jemalloc_per_stream": round((m1["jemalloc_allocated_bytes"] - m0["jemalloc_allocated_bytes"]) / n),
                    "jemalloc_per_stream_updated": round((m2["jemalloc_allocated_bytes"] - m0["jemalloc_allocated_bytes"]) / n),
                    "accounted_parts_per_stream": {
                        k[4:]: round((m1[k] - m0.get(k, 0)) / n) for k in m1 if k.startswith("acc_")},
                    "kernel_slab_per_stream_both_ends": round((k1 - k0) * 1024 / n),
                    "coalesced": m2.get("sse_coalesced_total", 0),
                }
                print(json.dumps(row), flush=True)
                out.append(row)
                close_all(streams, sel)
            finally:
                srv.stop()
    print("## summary: medians (per stream; a page of 64 boxes needs 1 many-box stream or 64 one-box streams)")
    med = lambda kind, f: statistics.median(r[f] for r in out if r["kind"] == kind)
    print("| measure | many-box stream (64 keys) | one-box stream | 64 one-box streams | many / 64 one-box |")
    print("|---|---:|---:|---:|---:|")
    for f, label in (("rss_per_stream", "RSS, streams open"), ("rss_per_stream_updated", "RSS, after an update to every box"),
                     ("accounted_per_stream", "accounted, open"), ("accounted_per_stream_updated", "accounted, after the updates"),
                     ("jemalloc_per_stream", "jemalloc allocated, open"),
                     ("jemalloc_per_stream_updated", "jemalloc allocated, after the updates"),
                     ("kernel_slab_per_stream_both_ends", "kernel slab, both ends (system-wide, noisy)")):
        m, s = med("many", f), med("single", f)
        print(f"| {label} | {m:,.0f} B | {s:,.0f} B | {64 * s:,.0f} B | {m / (64 * s) if s else float('nan'):.3f} |")


def events(a):
    out = []
    kinds = a.kinds.split(",")
    for rep in range(a.reps):
        for kind in kinds:
            srv = Server(a.bin, a.root)
            try:
                srv.seed()
                sel = selectors.DefaultSelector()
                streams = []
                if kind == "single":
                    streams = open_streams(srv.port, [f"/v1/boxes/{HOT}"] * a.subs, sel, 1)
                elif kind == "many":
                    streams = open_streams(srv.port, [many_path(ALL)] * a.subs, sel, 64)
                pub = Publisher(srv.port, sel)

                def publish(seconds):
                    t0 = time.monotonic()
                    n = int(seconds * a.rate)
                    for i in range(n):
                        due = t0 + i / a.rate
                        while True:
                            left = due - time.monotonic()
                            if left <= 0:
                                break
                            for key, _ in sel.select(left):
                                key.data.read(sel)
                        pub.send(HOT)
                    pump(sel, lambda: pub.answered >= pub.sent, 5.0)
                    return n

                publish(1.0)  # warm-up
                quiet(sel, 0.3)
                e0 = sum(s.events for s in streams)
                m0 = srv.metrics()
                perf = None
                if a.perf and kind != "none":
                    # The server's samples during the window (CPU 1 runs perf too).
                    perf = subprocess.Popen(
                        ["perf", "record", "-q", "-e", "cpu-clock", "-F", "2000", "-p", str(srv.pid),
                         "-o", os.path.join(a.perf, f"{kind}-{rep + 1}.data")],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    time.sleep(0.5)
                c0, (u0, s0) = srv.cpu_ns(), srv.cpu_ticks()
                w0 = time.monotonic()
                n = publish(a.seconds)
                want = e0 + n * len(streams)
                pump(sel, lambda: sum(s.events for s in streams) >= want, 10.0)
                quiet(sel, 0.2)
                wall = time.monotonic() - w0
                c1, (u1, s1) = srv.cpu_ns(), srv.cpu_ticks()
                if perf:
                    perf.send_signal(signal.SIGINT)
                    perf.wait()
                m1 = srv.metrics()
                ev = m1["sse_events_total"] - m0["sse_events_total"]
                got = sum(s.events for s in streams) - e0
                closed = sum(s.closed for s in streams)
                per = ev if ev else n  # none: per publish
                row = {
                    "op": "events", "kind": kind, "rep": rep + 1, "subscribers": len(streams),
                    "keys_per_stream": {"none": 0, "single": 1, "many": 64}[kind],
                    "rate": a.rate, "publishes": n, "events_server": ev, "events_client": got,
                    "coalesced": m1["sse_coalesced_total"] - m0["sse_coalesced_total"],
                    "closed": closed, "wall_s": round(wall, 3),
                    "cpu_s": (c1 - c0) / 1e9, "user_s": u1 - u0, "system_s": s1 - s0,
                    "cpu_us_per_event" if ev else "cpu_us_per_publish": (c1 - c0) / 1e3 / per,
                    "user_us_per_event" if ev else "user_us_per_publish": (u1 - u0) * 1e6 / per,
                    "system_us_per_event" if ev else "system_us_per_publish": (s1 - s0) * 1e6 / per,
                }
                print(json.dumps(row), flush=True)
                out.append(row)
                close_all(streams, sel)
            finally:
                srv.stop()
    nones = [r["cpu_us_per_publish"] for r in out if r["kind"] == "none"]
    pubs = statistics.median(nones) if nones else 0.0
    if not all(any(r["kind"] == k for r in out) for k in ("single", "many")):
        return
    print(f"## summary: medians of {a.reps}; {a.subs} subscribers, {a.rate} publishes/s to {HOT} for {a.seconds} s;"
          + (f" a publish with no subscriber costs {pubs:.1f} µs (subtracted for 'net')" if nones
             else " no round without subscribers: 'net' is not net of the publishes"))
    print("| stream | CPU µs / event | user | system | net of the publishes | events (server; client) | coalesced |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    res = {}
    for kind in ("single", "many"):
        rs = [r for r in out if r["kind"] == kind]
        cpu = statistics.median(r["cpu_us_per_event"] for r in rs)
        net = statistics.median((r["cpu_s"] * 1e6 - pubs * r["publishes"]) / r["events_server"] for r in rs)
        res[kind] = (cpu, net)
        print(f"| {kind} ({rs[0]['keys_per_stream']} key{'s' if kind == 'many' else ''}) | {cpu:.2f} "
              f"| {statistics.median(r['user_us_per_event'] for r in rs):.2f} "
              f"| {statistics.median(r['system_us_per_event'] for r in rs):.2f} | {net:.2f} "
              f"| {statistics.median(r['events_server'] for r in rs):,.0f}; {statistics.median(r['events_client'] for r in rs):,.0f} "
              f"| {statistics.median(r['coalesced'] for r in rs):,.0f} |")
    pairs = list(zip([r for r in out if r["kind"] == "single"], [r for r in out if r["kind"] == "many"]))
    ratios = [m["cpu_us_per_event"] / s["cpu_us_per_event"] for s, m in pairs]
    print(f"many / single: {res['many'][0] / res['single'][0]:.3f} of the medians (net {res['many'][1] / res['single'][1]:.3f});"
          f" median of the rounds' ratios {statistics.median(ratios):.3f}"
          f" (each: {', '.join(f'{x:.2f}' for x in ratios)})")
    user = [(m["user_s"] - s["user_s"]) * 1e6 / m["events_server"] for s, m in pairs]
    system = [(m["system_s"] - s["system_s"]) * 1e6 / m["events_server"] for s, m in pairs]
    print(f"many - single, µs per event: user {statistics.median(user):+.2f} (each: {', '.join(f'{x:+.2f}' for x in user)});"
          f" system {statistics.median(system):+.2f} (each: {', '.join(f'{x:+.2f}' for x in system)})")


def interleaved(a):
    """One server a round with both kinds of subscribers open at once: S streams
    of box-64 alone (single) and S streams of box-00..box-63 (many, box-63 last).
    Windows of --seconds publishing to box-64 (only the single streams deliver)
    and to box-63 (only the many streams) alternate, so the VM's drift hits both;
    windows publishing to box-65 (no subscriber) give the publishing's own CPU."""
    out = []
    for rnd in range(a.reps):
        srv = Server(a.bin, a.root)
        try:
            srv.seed(ALL + ["box-64", "box-65"])
            sel = selectors.DefaultSelector()
            groups = {
                "single": open_streams(srv.port, ["/v1/boxes/box-64"] * a.subs, sel, 1),
                "many": open_streams(srv.port, [many_path(ALL)] * a.subs, sel, 64),
                "none": [],
            }
            target = {"single": "box-64", "many": HOT, "none": "box-65"}
            pub = Publisher(srv.port, sel)

            def publish(key, seconds):
                t0 = time.monotonic()
                n = int(seconds * a.rate)
                for i in range(n):
                    due = t0 + i / a.rate
                    while True:
                        left = due - time.monotonic()
                        if left <= 0:
                            break
                        for k, _ in sel.select(left):
                            k.data.read(sel)
                    pub.send(key)
                pump(sel, lambda: pub.answered >= pub.sent, 5.0)
                return n

            def window(kind, w):
                streams = groups[kind]
                quiet(sel, 0.1)
                e0 = sum(s.events for s in streams)
                m0 = srv.metrics()
                c0, (u0, s0) = srv.cpu_ns(), srv.cpu_ticks()
                n = publish(target[kind], a.seconds)
                want = e0 + n * len(streams)
                pump(sel, lambda: sum(s.events for s in streams) >= want, 10.0)
                quiet(sel, 0.1)
                c1, (u1, s1) = srv.cpu_ns(), srv.cpu_ticks()
                m1 = srv.metrics()
                ev = m1["sse_events_total"] - m0["sse_events_total"]
                row = {
                    "op": "events-interleaved", "kind": kind, "round": rnd + 1, "window": w,
                    "subscribers": len(streams), "keys_per_stream": {"none": 0, "single": 1, "many": 64}[kind],
                    "key": target[kind], "publishes": n, "events_server": ev,
                    "events_client": sum(s.events for s in streams) - e0,
                    "coalesced": m1["sse_coalesced_total"] - m0["sse_coalesced_total"],
                    "closed": sum(s.closed for s in groups["single"] + groups["many"]),
                    "cpu_s": (c1 - c0) / 1e9, "user_s": u1 - u0, "system_s": s1 - s0,
                }
                if ev:
                    row["cpu_us_per_event"] = (c1 - c0) / 1e3 / ev
                else:
                    row["cpu_us_per_publish"] = (c1 - c0) / 1e3 / n
                print(json.dumps(row), flush=True)
                out.append(row)

            publish("box-64", 1.0)  # warm-up
            publish(HOT, 1.0)
            for w in range(a.windows):
                order = ("single", "many") if w % 2 == 0 else ("many", "single")
                for kind in order:
                    window(kind, w + 1)
                if w % 4 == 3:
                    window("none", w + 1)
            close_all(groups["single"] + groups["many"], sel)
        finally:
            srv.stop()
    pubs = statistics.median(r["cpu_us_per_publish"] for r in out if r["kind"] == "none")
    print(f"## summary: {a.reps} rounds (fresh servers) of {a.windows} alternated pairs of {a.seconds} s windows;"
          f" {a.subs} subscribers of each kind open throughout, {a.rate} publishes/s;"
          f" a publish with no subscriber costs {pubs:.1f} µs (subtracted for 'net')")
    print("| stream | CPU µs / event (median of windows) | user | system | net of the publishes | events a window | coalesced |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for kind in ("single", "many"):
        rs = [r for r in out if r["kind"] == kind]
        print(f"| {kind} ({rs[0]['keys_per_stream']} key{'s' if kind == 'many' else ''}) "
              f"| {statistics.median(r['cpu_us_per_event'] for r in rs):.2f} "
              f"| {statistics.median(r['user_s'] * 1e6 / r['events_server'] for r in rs):.2f} "
              f"| {statistics.median(r['system_s'] * 1e6 / r['events_server'] for r in rs):.2f} "
              f"| {statistics.median((r['cpu_s'] * 1e6 - pubs * r['publishes']) / r['events_server'] for r in rs):.2f} "
              f"| {statistics.median(r['events_server'] for r in rs):,.0f} | {sum(r['coalesced'] for r in rs):,.0f} |")
    ratios, nets, users = [], [], []
    for rnd in range(1, a.reps + 1):
        for w in range(1, a.windows + 1):
            p = {r["kind"]: r for r in out if r["round"] == rnd and r["window"] == w}
            s_, m_ = p["single"], p["many"]
            ratios.append(m_["cpu_us_per_event"] / s_["cpu_us_per_event"])
            nets.append(((m_["cpu_s"] * 1e6 - pubs * m_["publishes"]) / m_["events_server"])
                        / ((s_["cpu_s"] * 1e6 - pubs * s_["publishes"]) / s_["events_server"]))
            users.append(m_["cpu_us_per_event"] - s_["cpu_us_per_event"])
    q = statistics.quantiles(ratios, n=4)
    print(f"many / single, median of the {len(ratios)} pairs: {statistics.median(ratios):.3f}"
          f" (quartiles {q[0]:.3f}-{q[2]:.3f}, min {min(ratios):.3f}, max {max(ratios):.3f}); net {statistics.median(nets):.3f};"
          f" many - single: {statistics.median(users):+.2f} µs per event")
    for rnd in range(1, a.reps + 1):
        rr = ratios[(rnd - 1) * a.windows:rnd * a.windows]
        print(f"round {rnd}: median ratio {statistics.median(rr):.3f} ({', '.join(f'{x:.2f}' for x in rr)})")


def polls(a):
    keys = ALL[:a.boxes]
    srv = Server(a.bin, a.root)
    try:
        srv.seed()
        # The ETags, for the 304 variants.
        s = socket.create_connection(("127.0.0.1", srv.port))
        s.sendall(f"GET {many_path(keys)} HTTP/1.1\r\nHost: b\r\n\r\n".encode())
        st, head, body = read_answers(s, 1)[0]
        many_etag = header(head, b"etag")
        assert body.count(b'"k":') == a.boxes, body[:200]
        tags = []
        for k in keys:
            s.sendall(f"GET /v1/boxes/{k} HTTP/1.1\r\nHost: b\r\n\r\n".encode())
            tags.append(header(read_answers(s, 1)[0][1], b"etag"))
        s.close()

        def get(path, tag=None):
            inm = f"If-None-Match: {tag}\r\n" if tag else ""
            return f"GET {path} HTTP/1.1\r\nHost: b\r\n{inm}\r\n".encode()

        modes = {
            # name: (list of writes in a page, each with the answers it waits for)
            "many-200": [(get(many_path(keys)), 1)],
            "seq-200": [(get(f"/v1/boxes/{k}"), 1) for k in keys],
            "pipe-200": [(b"".join(get(f"/v1/boxes/{k}") for k in keys), a.boxes)],
            "many-304": [(get(many_path(keys), many_etag), 1)],
            "seq-304": [(get(f"/v1/boxes/{k}", t), 1) for k, t in zip(keys, tags)],
            "pipe-304": [(b"".join(get(f"/v1/boxes/{k}", t) for k, t in zip(keys, tags)), a.boxes)],
        }
        expect = {"200": 200, "304": 304}

        def run(mode, seconds):
            steps = modes[mode]
            code = expect[mode[-3:]]
            sel = selectors.DefaultSelector()
            conns = []
            for _ in range(a.conns):
                c = socket.create_connection(("127.0.0.1", srv.port))
                c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                c.setblocking(False)
                st = {"sock": c, "step": 0, "ans": Answers(), "pages": 0}
                sel.register(c, selectors.EVENT_READ, st)
                conns.append(st)
            c0, (u0, s0) = srv.cpu_ns(), srv.cpu_ticks()
            t0 = time.monotonic()
            end = t0 + seconds
            for st in conns:
                st["sock"].sendall(steps[0][0])
            stopping = False
            live = len(conns)
            while live:
                for key, _ in sel.select(1.0):
                    st = key.data
                    data = st["sock"].recv(1 << 20)
                    if not data:
                        raise SystemExit("polls: connection closed")
                    st["ans"].feed(data)
                    want = steps[st["step"]][1]
                    if len(st["ans"].done) < want:
                        continue
                    for status, head, _ in st["ans"].done:
                        if status != code:
                            raise SystemExit(f"{mode}: answered {status}, not {code}")
                    if len(st["ans"].done) > want or st["ans"].buf:
                        raise SystemExit(f"{mode}: more answers than asked")
                    st["ans"].done.clear()
                    st["step"] += 1
                    if st["step"] == len(steps):
                        st["step"] = 0
                        st["pages"] += 1
                        if time.monotonic() >= end:
                            sel.unregister(st["sock"])
                            live -= 1
                            continue
                    st["sock"].sendall(steps[st["step"]][0])
            wall = time.monotonic() - t0
            c1, (u1, s1) = srv.cpu_ns(), srv.cpu_ticks()
            for st in conns:
                st["sock"].close()
            pages = sum(st["pages"] for st in conns)
            return {
                "op": "polls", "mode": mode, "conns": a.conns, "boxes": a.boxes,
                "requests_per_page": 1 if mode.startswith("many") else a.boxes,
                "pages": pages, "wall_s": round(wall, 3), "pages_per_s": round(pages / wall),
                "cpu_s": (c1 - c0) / 1e9, "user_s": u1 - u0, "system_s": s1 - s0,
                "cpu_us_per_page": (c1 - c0) / 1e3 / pages,
                "user_us_per_page": (u1 - u0) * 1e6 / pages, "system_us_per_page": (s1 - s0) * 1e6 / pages,
                "server_cpu_share": round((c1 - c0) / 1e9 / wall, 3),
            }

        for m in modes:
            run(m, 0.5)  # warm-up
        out = []
        for rep in range(a.reps):
            for m in modes:
                row = run(m, a.seconds)
                row["rep"] = rep + 1
                print(json.dumps(row), flush=True)
                out.append(row)
    finally:
        srv.stop()
    print(f"## summary: medians of {a.reps}; a page = {a.boxes} boxes read; {a.conns} connection(s), closed loop")
    print("| page | server CPU µs / page | user | system | pages/s | many / this |")
    print("|---|---:|---:|---:|---:|---:|")
    med = {m: statistics.median(r["cpu_us_per_page"] for r in out if r["mode"] == m) for m in modes}
    for m in modes:
        rs = [r for r in out if r["mode"] == m]
        base = "many-" + m[-3:]
        print(f"| {m} | {med[m]:.2f} | {statistics.median(r['user_us_per_page'] for r in rs):.2f} "
              f"| {statistics.median(r['system_us_per_page'] for r in rs):.2f} "
              f"| {statistics.median(r['pages_per_s'] for r in rs):,.0f} | {med[base] / med[m]:.3f} |")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("part", choices=["memory", "events", "interleaved", "polls"])
    p.add_argument("--bin", default="target/release/pollbox")
    p.add_argument("--root", default=".")
    p.add_argument("--reps", type=int, default=None)
    p.add_argument("--streams", type=int, default=6400)
    p.add_argument("--subs", type=int, default=1000)
    p.add_argument("--rate", type=float, default=20.0)
    p.add_argument("--seconds", type=float, default=None)
    p.add_argument("--boxes", type=int, default=20)
    p.add_argument("--conns", type=int, default=1)
    p.add_argument("--kinds", default="none,single,many", help="events: which of none,single,many")
    p.add_argument("--perf", default=None, help="events: perf record the server into this folder")
    p.add_argument("--windows", type=int, default=10, help="interleaved: pairs of windows a round")
    a = p.parse_args()
    if a.reps is None:
        a.reps = {"memory": 2, "events": 7, "interleaved": 3, "polls": 3}[a.part]
    if a.seconds is None:
        a.seconds = {"memory": 0, "events": 5.0, "interleaved": 1.0, "polls": 4.0}[a.part]
    {"memory": memory, "events": events, "interleaved": interleaved, "polls": polls}[a.part](a)


if __name__ == "__main__":
    main()
