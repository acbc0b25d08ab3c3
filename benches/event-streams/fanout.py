#!/usr/bin/env python3
"""A neutral client for pollbox and Nchan: subscribers, a publisher, kernel timestamps.

Python stdlib only (selectors, socket, recvmsg with SO_TIMESTAMPNS), so neither
server is measured with the other's tool. Each subscriber socket records the
kernel's receive timestamp of the bytes that completed an event; latency is that
timestamp minus the wall-clock time (CLOCK_REALTIME, the clock SO_TIMESTAMPNS
uses) just before the publish request was written. The client's own speed
therefore does not enter the latency, only the servers' (and the loopback's).

  fanout.py fanout  --server pollbox|nchan --kind sse|lp --port P --pid PID [--subs 1000 --publishes 50]
  fanout.py single  --server ... --kind ... --port P --pid PID [--publishes 200]
  fanout.py memory  --server ... --kind ... --port P --pid PID [--streams 10000 --keys 1000]
  fanout.py slow    --server ... --port P --pid PID [--updates 10000]

Prints one JSON object. --pid is the process whose CPU (utime/stime from
/proc/PID/stat, all threads) and RSS are read: pollbox's, or nginx's one worker.
Both servers are framed here: pollbox's SSE (close-delimited) and Nchan's
(chunked), pollbox's long-poll (`?after=V`, ETag) and Nchan's (If-None-Match /
If-Modified-Since from Etag / Last-Modified).
"""
import argparse
import json
import os
import selectors
import socket
import statistics
import struct
import sys
import time

SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
CMSG = socket.CMSG_SPACE(16)
TICK = os.sysconf("SC_CLK_TCK")


# ------------------------------------------------------------------------------
# The two servers' URLs


class Pollbox:
    def __init__(self):
        self.name = "pollbox"

    def sub(self, kind, key, state):
        if kind == "sse":
            return (f"GET /v1/boxes/{key} HTTP/1.1\r\nHost: b\r\n"
                    "Accept: text/event-stream\r\n\r\n").encode()
        after = state.get("etag", "0").strip('"') or "0"
        return f"GET /v1/boxes/{key}?after={after}&wait_ms=30000 HTTP/1.1\r\nHost: b\r\n\r\n".encode()

    def pub(self, key, i):
        body = json.dumps({"value": i, "player": "p-%07d" % (i % 10_000_000)}).encode()
        return (f"POST /v1/boxes/{key} HTTP/1.1\r\nHost: b\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode() + body


class Nchan:
    def __init__(self):
        self.name = "nchan"

    def sub(self, kind, key, state):
        if kind == "sse":
            return (f"GET /es/{key} HTTP/1.1\r\nHost: b\r\n"
                    "Accept: text/event-stream\r\n\r\n").encode()
        extra = ""
        if "etag" in state:
            extra += f"If-None-Match: {state['etag']}\r\n"
        if "last-modified" in state:
            extra += f"If-Modified-Since: {state['last-modified']}\r\n"
        return f"GET /lp/{key} HTTP/1.1\r\nHost: b\r\n{extra}\r\n".encode()

    def pub(self, key, i):
        # About the size of pollbox's payload for the same message.
        body = json.dumps({"k": key, "ver": i, "v": i, "sum": i, "n": i, "by": "p-%07d" % (i % 10_000_000)}).encode()
        return (f"POST /pub/{key} HTTP/1.1\r\nHost: b\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode() + body


# ------------------------------------------------------------------------------
# An HTTP/1.1 response reader (incremental): head, then a body delimited by
# Content-Length, chunked encoding or the end of the stream.


class Reader:
    def __init__(self, stream):
        self.stream = stream  # True: the body is an event stream
        self.reset()

    def reset(self):
        self.buf = b""
        self.head = None
        self.status = None
        self.headers = {}
        self.mode = None
        self.left = 0
        self.body = b""
        self.chunk_left = None
        self.sse = b""

    def feed(self, data):
        """Feed bytes; return a list of what completed: ('event', data) for an
        SSE event with a data field, ('response', status, headers, body)."""
        out = []
        self.buf += data
        while True:
            if self.head is None:
                i = self.buf.find(b"\r\n\r\n")
                if i < 0:
                    return out
                head = self.buf[:i].decode("latin-1").split("\r\n")
                self.buf = self.buf[i + 4:]
                self.head = head
                self.status = int(head[0].split()[1])
                self.headers = {}
                for line in head[1:]:
                    k, _, v = line.partition(":")
                    self.headers[k.strip().lower()] = v.strip()
                if self.headers.get("transfer-encoding", "").lower() == "chunked":
                    self.mode = "chunked"
                    self.chunk_left = None
                elif "content-length" in self.headers and not self.stream:
                    self.mode = "length"
                    self.left = int(self.headers["content-length"])
                elif self.status in (204, 304):
                    self.mode = "length"
                    self.left = 0
                else:
                    self.mode = "close"
            if self.mode == "length":
                take = self.buf[:self.left]
                self.body += take
                self.buf = self.buf[len(take):]
                self.left -= len(take)
                if self.left:
                    return out
                out.append(("response", self.status, self.headers, self.body))
                rest = self.buf
                self.reset()
                self.buf = rest
                continue
            if self.mode == "close":
                self._body(self.buf, out)
                self.buf = b""
                return out
            # chunked: "size" (a size line), "data" (chunk_left bytes), "crlf" (after data)
            while True:
                if self.chunk_left is None:
                    i = self.buf.find(b"\r\n")
                    if i < 0:
                        return out
                    size = int(self.buf[:i].split(b";")[0], 16)
                    self.buf = self.buf[i + 2:]
                    if size == 0:
                        self.chunk_left = -1  # the final CRLF
                    else:
                        self.chunk_left = size
                if self.chunk_left == -1:
                    if len(self.buf) < 2:
                        return out
                    self.buf = self.buf[2:]
                    if not self.stream:
                        out.append(("response", self.status, self.headers, self.body))
                    rest = self.buf
                    self.reset()
                    self.buf = rest
                    break
                if self.chunk_left > 0:
                    take = self.buf[:self.chunk_left]
                    self.buf = self.buf[len(take):]
                    self.chunk_left -= len(take)
                    self._body(take, out)
                    if self.chunk_left:
                        return out
                # chunk_left == 0: the CRLF after the data
                if len(self.buf) < 2:
                    return out
                self.buf = self.buf[2:]
                self.chunk_left = None

    def _body(self, data, out):
        if not self.stream:
            self.body += data
            return
        self.sse += data.replace(b"\r\n", b"\n")
        while True:
            i = self.sse.find(b"\n\n")
            if i < 0:
                return
            block, self.sse = self.sse[:i], self.sse[i + 2:]
            data_lines = [l[5:].lstrip(b" ") for l in block.split(b"\n") if l.startswith(b"data:")]
            if data_lines:
                out.append(("event", b"\n".join(data_lines)))


# ------------------------------------------------------------------------------


def cpu(pid):
    """(user s, system s) of the whole process, all threads."""
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return int(parts[11]) / TICK, int(parts[12]) / TICK


def cpu_ns(pid):
    """CPU time of all threads in ns (schedstat: finer than ticks)."""
    total = 0
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{t}/schedstat") as f:
                total += int(f.read().split()[0])
        except OSError:
            pass
    return total


def recv_q(sock):
    import fcntl
    import termios
    buf = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
    return struct.unpack("i", buf)[0]


def server_send_q(server_port, client_port):
    """Bytes queued in the server's side of one connection (ss's Send-Q): kernel
    memory the server put there and the client has not read."""
    import subprocess
    out = subprocess.run(["ss", "-tnH", "state", "established",
                          f"( sport = :{server_port} and dport = :{client_port} )"],
                         capture_output=True, text=True).stdout.split()
    return int(out[1]) if len(out) >= 2 else None


def rss(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def metrics(port):
    """pollbox's own figures: accounted bytes (all parts), buffered bytes, SSE counters."""
    import urllib.request
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out = {"accounted": 0}
    for line in text.splitlines():
        if line.startswith("pollbox_accounted_bytes"):
            out["accounted"] += float(line.split()[-1])
        for name in ("pollbox_buffered_bytes", "pollbox_sse_events_total", "pollbox_sse_coalesced_total",
                     "pollbox_connections_open"):
            if line.startswith(name + " "):
                out[name[len("pollbox_"):]] = float(line.split()[-1])
    return out


def connect(port, rcvbuf=None):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.connect(("127.0.0.1", port))
    s.setblocking(False)
    return s


def recv_ts(s):
    """(bytes, kernel receive timestamp in ns or None); b'' at the end."""
    data, anc, _flags, _addr = s.recvmsg(65536, CMSG)
    ts = None
    for level, typ, d in anc:
        if level == socket.SOL_SOCKET and typ == SO_TIMESTAMPNS and len(d) >= 16:
            sec, nsec = struct.unpack("qq", d[:16])
            ts = sec * 1_000_000_000 + nsec
    return data, ts


class Sub:
    __slots__ = ("sock", "reader", "key", "state", "events", "last_ts", "closed", "responses", "last_data")

    def __init__(self, sock, key, stream):
        self.sock = sock
        self.key = key
        self.reader = Reader(stream)
        self.state = {}
        self.events = 0
        self.last_ts = None
        self.closed = False
        self.responses = 0
        self.last_data = None


class Client:
    def __init__(self, srv, kind, port):
        self.srv = srv
        self.kind = kind
        self.port = port
        self.sel = selectors.DefaultSelector()
        self.subs = []

    def open(self, key, rcvbuf=None):
        s = connect(self.port, rcvbuf)
        sub = Sub(s, key, self.kind == "sse")
        s.sendall(self.srv.sub(self.kind, key, sub.state))
        self.sel.register(s, selectors.EVENT_READ, sub)
        self.subs.append(sub)
        return sub

    def add_publisher(self, pub):
        self.sel.register(pub.sock, selectors.EVENT_READ, pub)

    def dispatch(self, data):
        if isinstance(data, Publisher):
            data.read()
        else:
            self.on_readable(data)

    def on_readable(self, sub):
        try:
            data, ts = recv_ts(sub.sock)
        except BlockingIOError:
            return
        except OSError:
            data, ts = b"", None
        if not data:
            sub.closed = True
            self.sel.unregister(sub.sock)
            return
        for item in sub.reader.feed(data):
            if item[0] == "event":
                sub.events += 1
                sub.last_ts = ts
                sub.last_data = item[1]
            else:
                _, status, headers, _body = item
                sub.responses += 1
                if status == 200:
                    sub.events += 1
                    sub.last_ts = ts
                for h in ("etag", "last-modified"):
                    if h in headers:
                        sub.state[h] = headers[h]

    def pump(self, until, timeout):
        """Handle readiness until `until()` or `timeout` seconds."""
        end = time.monotonic() + timeout
        while not until():
            left = end - time.monotonic()
            if left <= 0:
                return False
            for key, _ in self.sel.select(min(left, 0.05)):
                self.dispatch(key.data)
        return True

    def quiet(self, secs):
        """Handle readiness until nothing arrived for `secs`."""
        while True:
            evs = self.sel.select(secs)
            if not evs:
                return
            for key, _ in evs:
                self.dispatch(key.data)

    def repoll(self):
        for sub in self.subs:
            if not sub.closed:
                sub.sock.sendall(self.srv.sub(self.kind, sub.key, sub.state))


class Publisher:
    def __init__(self, srv, port):
        self.srv = srv
        self.sock = connect(port)
        self.reader = Reader(False)
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.sock, selectors.EVENT_READ)
        self.answer_ts = None
        self.answered = 0

    def send(self, key, i):
        req = self.srv.pub(key, i)
        t = time.time_ns()
        self.sock.sendall(req)
        return t

    def poll(self, timeout=0.0):
        for _ in self.sel.select(timeout):
            self.read()

    def read(self):
        try:
            data, ts = recv_ts(self.sock)
        except BlockingIOError:
            return
        if not data:
            raise SystemExit("publisher: connection closed")
        for item in self.reader.feed(data):
            if item[1] >= 300:
                raise SystemExit(f"publish answered {item[1]}: {item[3][:200]!r}")
            self.answer_ts = ts
            self.answered += 1

    def publish_and_wait(self, key, i, timeout=5.0):
        want = self.answered + 1
        self.send(key, i)
        end = time.monotonic() + timeout
        while self.answered < want:
            if time.monotonic() > end:
                raise SystemExit("publish: no answer")
            self.poll(0.05)


def pct(xs, p):
    xs = sorted(xs)
    if not xs:
        return None
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


# ------------------------------------------------------------------------------


def make_key(pub, key):
    pub.publish_and_wait(key, 1)


def open_subs(client, keys, n, batch=200):
    for i in range(n):
        client.open(keys[i % len(keys)])
        if i % batch == batch - 1:
            client.quiet(0.0)
    # Initial events (the box as it is), or the long-polls' first answers.
    client.quiet(0.3)
    if client.kind == "lp":
        # A first long-poll may have answered at once (the channel's message, or
        # pollbox's box with after=0): poll again with what it said, to park.
        client.repoll()
        client.quiet(0.3)
    closed = sum(s.closed for s in client.subs)
    if closed:
        raise SystemExit(f"{closed} subscribers were closed by the server")


def fanout(a, srv):
    key = "fan"
    pub = Publisher(srv, a.port)
    make_key(pub, key)
    client = Client(srv, a.kind, a.port)
    open_subs(client, [key], a.subs)
    client.add_publisher(pub)
    lat, ans = [], []
    n = len(client.subs)
    u0, s0 = cpu(a.pid)
    c0 = cpu_ns(a.pid)
    w0 = time.monotonic()
    for i in range(a.publishes):
        base = [s.events for s in client.subs]
        want = pub.answered + 1
        t = pub.send(key, 1000 + i)
        ok = client.pump(lambda: pub.answered >= want and all(s.events > b for s, b in zip(client.subs, base)),
                         10.0)
        if not ok:
            got = sum(s.events > b for s, b in zip(client.subs, base))
            raise SystemExit(f"publish {i}: {got} of {n} delivered within 10 s")
        last = max(s.last_ts for s in client.subs)
        lat.append((last - t) / 1000)
        ans.append((pub.answer_ts - t) / 1000)
        if a.kind == "lp":
            client.repoll()
            # Let the server read and park the new long-polls.
            client.quiet(0.03)
    wall = time.monotonic() - w0
    u1, s1 = cpu(a.pid)
    c1 = cpu_ns(a.pid)
    deliveries = n * a.publishes
    return {
        "op": "fanout", "server": srv.name, "kind": a.kind, "subscribers": n, "publishes": a.publishes,
        "last_delivery_us_p50": statistics.median(lat), "last_delivery_us_p90": pct(lat, 90),
        "publisher_answer_us_p50": statistics.median(ans), "publisher_answer_us_p90": pct(ans, 90),
        "cpu_us_per_delivery": (c1 - c0) / 1000 / deliveries,
        "user_us_per_delivery": (u1 - u0) * 1e6 / deliveries,
        "system_us_per_delivery": (s1 - s0) * 1e6 / deliveries,
        "wall_s": wall,
    }


def single(a, srv):
    key = "one"
    pub = Publisher(srv, a.port)
    make_key(pub, key)
    client = Client(srv, a.kind, a.port)
    open_subs(client, [key], 1)
    client.add_publisher(pub)
    sub = client.subs[0]
    lat, ans = [], []
    for i in range(a.publishes):
        base = sub.events
        want = pub.answered + 1
        t = pub.send(key, 1000 + i)
        ok = client.pump(lambda: sub.events > base and pub.answered >= want, 5.0)
        if not ok:
            raise SystemExit(f"publish {i}: not delivered")
        lat.append((sub.last_ts - t) / 1000)
        ans.append((pub.answer_ts - t) / 1000)
        if a.kind == "lp":
            client.repoll()
        client.quiet(0.005)
    return {
        "op": "single", "server": srv.name, "kind": a.kind, "publishes": a.publishes,
        "delivery_us_p50": statistics.median(lat), "delivery_us_p90": pct(lat, 90),
        "publisher_answer_us_p50": statistics.median(ans),
    }


def memory(a, srv):
    keys = [f"m{i}" for i in range(a.keys)]
    pub = Publisher(srv, a.port)
    for k in keys:
        make_key(pub, k)
    time.sleep(0.5)
    r0 = rss(a.pid)
    m0 = metrics(a.port) if srv.name == "pollbox" else None
    client = Client(srv, a.kind, a.port)
    open_subs(client, keys, a.streams)
    time.sleep(1.0)
    client.quiet(0.2)
    r1 = rss(a.pid)
    m1 = metrics(a.port) if srv.name == "pollbox" else None
    n = sum(not s.closed for s in client.subs)
    res = {"op": "memory", "server": srv.name, "kind": a.kind, "streams": n, "keys": a.keys,
           "rss_before": r0, "rss_after": r1, "rss_per_stream": (r1 - r0) / n}
    if m0:
        res.update(accounted_before=m0["accounted"], accounted_after=m1["accounted"],
                   accounted_per_stream=(m1["accounted"] - m0["accounted"]) / n,
                   connections_open=m1.get("connections_open"))
    return res


def slow(a, srv):
    key = "slow"
    pub = Publisher(srv, a.port)
    make_key(pub, key)
    # A subscriber with a small receive buffer that reads its response head and
    # first event, then nothing more.
    client = Client(srv, "sse", a.port)
    sub = client.open(key, rcvbuf=4096)
    client.pump(lambda: sub.events >= 1, 5.0)
    client.sel.unregister(sub.sock)
    time.sleep(0.3)
    r0 = rss(a.pid)
    m0 = metrics(a.port) if srv.name == "pollbox" else None
    cpu0 = sum(cpu(a.pid))
    t0 = time.monotonic()
    # Pipelined in windows of 64: fast, and the answers are all read.
    window = 64
    sent = 0
    # Bounded in time too: a server whose work per update grows with the backlog
    # it holds for the reader stops being published to after --max-seconds.
    stop_at = t0 + a.max_seconds
    while sent < a.updates and time.monotonic() < stop_at:
        k = min(window, a.updates - sent)
        for j in range(k):
            pub.send(key, 2 + sent + j)
        want = pub.answered + k
        sent += k
        end = time.monotonic() + 30
        while pub.answered < want:
            if time.monotonic() > end:
                raise SystemExit("slow: publisher got no answer")
            pub.poll(0.05)
    secs = time.monotonic() - t0
    time.sleep(0.5)
    r1 = rss(a.pid)
    res = {"op": "slow", "server": srv.name, "updates": sent, "updates_asked": a.updates, "publish_s": secs,
           "server_cpu_s": sum(cpu(a.pid)) - cpu0,
           "rss_before": r0, "rss_after": r1, "rss_delta": r1 - r0, "reader_open": not sub.closed}
    if m0:
        m1 = metrics(a.port)
        res.update(accounted_before=m0["accounted"], accounted_after=m1["accounted"],
                   buffered_before=m0.get("buffered_bytes"), buffered_after=m1.get("buffered_bytes"),
                   sse_events=m1.get("sse_events_total", 0) - m0.get("sse_events_total", 0),
                   coalesced=m1.get("sse_coalesced_total", 0) - m0.get("sse_coalesced_total", 0))
    # Still unread in the subscriber's socket, and queued in the server's socket:
    # kernel memory, not the server's RSS.
    res["client_recv_q"] = recv_q(sub.sock)
    res["server_send_q"] = server_send_q(a.port, sub.sock.getsockname()[1])
    # Now read everything: how many of the 10,000 versions came, and whether the
    # newest is the last one (a box is state: the newest must arrive).
    before = sub.events
    client.sel.register(sub.sock, selectors.EVENT_READ, sub)
    client.quiet(1.0)
    res["events_read_after"] = sub.events - before
    try:
        last = json.loads(sub.last_data)
        res["last_version_read"] = last.get("ver", last.get("v"))
    except (TypeError, ValueError):
        res["last_version_read"] = None
    res["newest_version_published"] = 1 + sent
    return res


def main():
    p = argparse.ArgumentParser()
    p.add_argument("op", choices=["fanout", "single", "memory", "slow"])
    p.add_argument("--server", choices=["pollbox", "nchan"], required=True)
    p.add_argument("--kind", choices=["sse", "lp"], default="sse")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--pid", type=int, required=True)
    p.add_argument("--subs", type=int, default=1000)
    p.add_argument("--publishes", type=int, default=50)
    p.add_argument("--streams", type=int, default=10000)
    p.add_argument("--keys", type=int, default=1000)
    p.add_argument("--updates", type=int, default=10000)
    p.add_argument("--label", default="")
    p.add_argument("--max-seconds", type=float, default=60.0)
    a = p.parse_args()
    srv = Pollbox() if a.server == "pollbox" else Nchan()
    res = {"fanout": fanout, "single": single, "memory": memory, "slow": slow}[a.op](a, srv)
    if a.label:
        res = {"target": a.label, **res}
    print(json.dumps(res), flush=True)


if __name__ == "__main__":
    sys.exit(main())
