#!/usr/bin/env python3
"""Routing smoke test for deploy/haproxy/haproxy.cfg.tmpl, with stub nodes.

Runs the real HAProxy on loopback in front of two tiny stub HTTP servers that stand
in for pollbox nodes and answer with their own name. It checks the promises the
config makes, not pollbox itself (the system test with real nodes does that):

- ingest (POST) and poll (GET, with a long-poll query string) of one key reach the
  same node, for 1,000 keys, and both nodes get a fair share of keys;
- percent-encoded and plain spellings of one key reach the same node;
- POST /v1/ingest and a path with a broken %-escape are refused with 400 by HAProxy;
- /metrics (however spelled) is refused with 404 by HAProxy, no node asked;
- a node that closes a connection without answering: a GET is retried on that
  same node (200), a POST and a long-poll are not retried (502, seen once);
- a dead node's keys fail with 503 and are not re-hashed onto the live node, the
  live node's keys keep working, and the dead node gets its keys back on return.

Needs python3 and haproxy on PATH. Exits 0 on success, 1 with a message otherwise.
"""

import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote

HERE = os.path.dirname(os.path.abspath(__file__))
# SMOKE_HAPROXY_CFG lets a test run the checks against a changed copy.
TEMPLATE = os.environ.get("SMOKE_HAPROXY_CFG") or os.path.join(HERE, "haproxy.cfg.tmpl")
KEYS = 1000


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


PROXY_V2 = b"\r\n\r\n\x00\r\nQUIT\n"


def take_proxy_header(conn):
    """Read the PROXY v2 header HAProxy starts a connection with (send-proxy-v2)
    off `conn`: the client address it names, "local" for a LOCAL header (a
    health check), None when the connection starts without one."""
    head = conn.recv(16, socket.MSG_PEEK | socket.MSG_WAITALL)
    if len(head) < 16 or head[:12] != PROXY_V2:
        return None
    need = 16 + int.from_bytes(head[14:16], "big")
    data = b""
    while len(data) < need:
        chunk = conn.recv(need - len(data))
        if not chunk:
            return None
        data += chunk
    if data[12] & 0x0F == 0:
        return "local"
    family = {1: (socket.AF_INET, 4), 2: (socket.AF_INET6, 16)}.get(data[13] >> 4)
    return socket.inet_ntop(family[0], data[16:16 + family[1]]) if family else "unspec"


class QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        # HAProxy's health checks close with a reset; that is not a failure.
        pass


class StubNode:
    """An HTTP/1.1 keep-alive server that answers every request with its name."""

    def __init__(self, name, port):
        self.name = name
        self.port = port
        self.server = None
        self.conns = set()
        self.lock = threading.Lock()
        # close_next > 0: close that many requests' connections without answering.
        self.close_next = 0
        self.seen = {"GET": 0, "POST": 0}
        # For each request but health checks: what its connection's PROXY v2
        # header named (None: it had none).
        self.proxied = []

    def start(self):
        name = self.name
        node = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Headers and body go out in two writes; without this, Nagle and
            # delayed ACKs add ~40 ms to every request.
            disable_nagle_algorithm = True

            def setup(self):
                self.proxy_client = take_proxy_header(self.request)
                super().setup()
                with node.lock:
                    node.conns.add(self.connection)

            def finish(self):
                with node.lock:
                    node.conns.discard(self.connection)
                super().finish()

            def log_message(self, *args):
                pass

            def answer(self):
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                path = self.path.split("?", 1)[0]
                if path != "/healthz":
                    with node.lock:
                        node.proxied.append(self.proxy_client)
                        node.seen[self.command] += 1
                        close = node.close_next > 0
                        node.close_next -= close
                    if close:
                        # Like a node dying mid-request, or closing a kept-alive
                        # connection just as HAProxy reuses it: no answer at all.
                        self.close_connection = True
                        self.connection.shutdown(socket.SHUT_RDWR)
                        return
                if path == "/healthz":
                    body = b"ok"
                else:
                    key = unquote(path[len("/v1/boxes/"):])
                    body = json.dumps({"node": name, "key": key}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = answer
            do_POST = answer

        self.server = QuietServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        """Stop like a dead process: close the listener and every open connection."""
        self.server.shutdown()
        self.server.server_close()
        with self.lock:
            for conn in list(self.conns):
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            self.conns.clear()


class Client:
    """One keep-alive connection to HAProxy, reopened when HAProxy closes it."""

    def __init__(self, port):
        self.port = port
        self.conn = None

    def request(self, method, path, body=None):
        for attempt in range(2):
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
            try:
                headers = {"Content-Type": "application/json"} if body is not None else {}
                self.conn.request(method, path, body=body, headers=headers)
                resp = self.conn.getresponse()
                data = resp.read()
                if resp.getheader("Connection", "").lower() == "close":
                    self.conn.close()
                    self.conn = None
                return resp.status, data
            except (ConnectionError, http.client.HTTPException):
                self.conn.close()
                self.conn = None
                if attempt == 1:
                    raise
        raise AssertionError("unreachable")

    def node_of(self, method, path, body=None):
        status, data = self.request(method, path, body)
        if status != 200:
            raise AssertionError(f"{method} {path}: expected 200, got {status}: {data[:200]!r}")
        return json.loads(data)["node"]


def once(port, method, path, body=None):
    """One request on a new connection, never retried: (status, body)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def wait_for_port(port, proc, deadline_s=10.0):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise AssertionError(f"haproxy exited early with status {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"haproxy did not listen on port {port} within {deadline_s} s")


def check(cond, message):
    if not cond:
        raise AssertionError(message)


# /metrics as a client might spell it: plain, with a query, percent-encoded, with a
# trailing slash or an encoded "?".
METRICS_PATHS = ("/metrics", "/metrics?name[]=pollbox_boxes", "/%6Detrics", "/metrics/", "/metrics%3Fx")


def check_metrics_refused(request, nodes, where):
    """/metrics through the load balancer: 404 from HAProxy itself, no node asked.
    request(path) -> (status, body)."""
    before = [dict(n.seen) for n in nodes]
    for path in METRICS_PATHS:
        status, data = request(path)
        check(status == 404 and json.loads(data) == {"error": "not found"},
              f"GET {path} ({where}): expected HAProxy's 404, got {status} {data[:120]!r}")
    asked = [n.name for n, b in zip(nodes, before) if n.seen != b]
    check(not asked, f"/metrics ({where}) reached {asked}: the frontend must refuse it")


def run(client, nodes):
    # 1. Ingest and long-poll of each key meet on one node.
    owner = {}
    for i in range(KEYS):
        key = f"box-{i}"
        body = json.dumps({"key": key, "value": i, "player": "p-1"})
        posted = client.node_of("POST", f"/v1/boxes/{key}", body)
        polled = client.node_of("GET", f"/v1/boxes/{key}?after={i}&wait_ms=25")
        check(posted == polled, f"{key}: ingest went to {posted}, poll to {polled}")
        owner[key] = posted
    share = {n.name: sum(1 for v in owner.values() if v == n.name) for n in nodes}
    print(f"  {KEYS} keys: ingest and poll met on one node for every key; share {share}")
    for name, count in share.items():
        check(count >= KEYS // 5, f"{name} got only {count} of {KEYS} keys: hashing is lopsided")

    # 2. Percent-encoded spellings of a key hash like the plain one.
    for i in range(0, KEYS, 50):
        plain = f"box-{i}"
        encoded = "".join(f"%{ord(c):02X}" if c == "-" else c for c in plain)
        got = client.node_of("GET", f"/v1/boxes/{encoded}")
        check(got == owner[plain], f"/v1/boxes/{encoded} went to {got}, {plain} lives on {owner[plain]}")
    print("  percent-encoded keys reach the node of their decoded key")

    # 3. Requests that cannot be routed by key are refused by HAProxy itself.
    status, data = client.request("POST", "/v1/ingest", json.dumps([{"key": "a", "value": 1}]))
    check(status == 400 and b"/v1/boxes/{key}" in data, f"POST /v1/ingest: got {status} {data!r}")
    status, data = client.request("GET", "/v1/boxes/bad%zzkey")
    check(status == 400 and b"percent-encoding" in data, f"broken escape: got {status} {data!r}")
    print("  POST /v1/ingest and broken %-escapes answered 400 by the load balancer")
    check_metrics_refused(lambda path: client.request("GET", path), nodes, "plain HTTP")
    print(f"  /metrics refused (404) by the load balancer, no node asked: {', '.join(METRICS_PATHS)}")

    # 4. A node closes without answering: a GET is retried once, on the same node
    #    (the key's), a POST or a long-poll is not. Each on a new client connection
    #    that never retries: on a kept-alive one HAProxy passes the close on, for
    #    the client to retry (see haproxy.cfg).
    node = nodes[0]
    key = next(k for k, v in owner.items() if v == node.name)
    attempts = [
        ("GET", f"/v1/boxes/{key}", None, 200, 2),
        ("POST", f"/v1/boxes/{key}", json.dumps({"value": 1}), 502, 1),
        ("GET", f"/v1/boxes/{key}?after=1&wait_ms=25", None, 502, 1),
    ]
    for method, path, body, want, sent in attempts:
        before = dict(node.seen)
        node.close_next = 1
        status, data = once(client.port, method, path, body)
        check(status == want, f"{method} {path} with one closed connection: expected {want}, got {status} {data[:120]!r}")
        if want == 200:
            check(json.loads(data)["node"] == node.name, f"{method} {path} was retried on another node")
        got = node.seen[method] - before[method]
        check(got == sent, f"{method} {path}: {node.name} saw it {got} times, expected {sent}")
        check(node.close_next == 0, f"{method} {path}: never reached {node.name}")
    print("  a connection closed unanswered: GET retried on its key's node; POST and long-poll not re-sent (502)")
    check_proxied(nodes)
    return owner


def check_proxied(nodes):
    """Every request HAProxy routed came on a connection that began with a
    PROXY v2 header naming the client (the test's, 127.0.0.1)."""
    named = [c for n in nodes for c in n.proxied]
    check(named and set(named) == {"127.0.0.1"}, f"PROXY v2 headers named {set(named)} (None: no header)")
    print(f"  all {len(named)} requests routed came on connections whose PROXY v2 header named the client")


def main():
    if not os.path.exists(TEMPLATE):
        print(f"missing {TEMPLATE}", file=sys.stderr)
        return 1
    nodes = [StubNode("node1", free_port()), StubNode("node2", free_port())]
    front = free_port()
    env = dict(os.environ, FRONT_PORT=str(front),
               NODE1=f"127.0.0.1:{nodes[0].port}", NODE2=f"127.0.0.1:{nodes[1].port}")
    for n in nodes:
        n.start()
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(["haproxy", "-db", "-f", TEMPLATE], env=env,
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for_port(front, proc)
        client = Client(front)
        owner = run(client, nodes)

        # 5. A dead node's keys fail; they are not moved to the live node.
        dead, live = nodes[1], nodes[0]
        dead.stop()
        # Long enough for the health backend to mark it down (inter 2s, fall 3),
        # which must not change routing.
        time.sleep(7)
        dead_keys = [k for k, v in owner.items() if v == dead.name][:20]
        live_keys = [k for k, v in owner.items() if v == live.name][:20]
        for key in dead_keys:
            status, data = client.request("GET", f"/v1/boxes/{key}")
            check(status == 503, f"{key} (on stopped {dead.name}): expected 503, got {status} {data[:120]!r}")
        for key in live_keys:
            check(client.node_of("GET", f"/v1/boxes/{key}") == live.name, f"{key} left {live.name}")
        print(f"  {dead.name} stopped: its keys answer 503, none re-hashed; {live.name}'s keys unaffected")

        # 6. The node comes back on its address and gets its keys back.
        dead.start()
        for key in dead_keys:
            check(client.node_of("GET", f"/v1/boxes/{key}") == dead.name, f"{key} did not return to {dead.name}")
        print(f"  {dead.name} restarted: its keys are served by it again")
    except AssertionError as e:
        log.seek(0)
        tail = log.read()[-4000:].decode(errors="replace")
        print(f"FAIL: {e}\n--- haproxy output (tail) ---\n{tail}", file=sys.stderr)
        return 1
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
        for n in nodes:
            try:
                n.stop()
            except Exception:
                pass
    print("haproxy routing smoke test: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
