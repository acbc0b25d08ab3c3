#!/usr/bin/env python3
"""Smoke test for deploy/haproxy/haproxy-replicas.cfg.tmpl, with stub nodes.

Runs the real HAProxy on loopback in front of two stub HTTP servers that stand in
for pollbox replicas of one Kafka log (any node serves any key) and answer with
their own name. It checks the promises the config makes, not pollbox itself (the
README's "A cluster on one machine" runs it in front of real nodes):

- requests of one key, and POST /v1/ingest batches, are spread over both nodes;
- least connections: with a long-poll held on one node, new requests go to the other;
- a node whose /readyz is 503 (catching up with the log) gets no requests, and gets
  them again once ready;
- /metrics (however spelled) is refused with 404 by HAProxy, no node asked;
- a stopped node: every GET and POST still succeeds, on the other node;
- a node that closes without answering, or answers 503: a GET is retried on the
  other node (200), a POST is not retried (the client gets the failure, the node
  saw the POST once), since an ingest may already be in the log.

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

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from smoke_test import check_metrics_refused, take_proxy_header  # noqa: E402

CONFIG = os.environ.get("SMOKE_HAPROXY_CFG") or os.path.join(HERE, "haproxy-replicas.cfg.tmpl")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class QuietServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request, client_address):
        pass


class StubNode:
    """A keep-alive HTTP/1.1 server answering with its name. `mode` makes it
    misbehave: "ok", "close" (drop the connection without an answer) or "503"."""

    def __init__(self, name, port):
        self.name = name
        self.port = port
        self.ready = True
        self.mode = "ok"
        self.seen = {"GET": 0, "POST": 0}
        self.lock = threading.Lock()
        self.conns = set()
        self.server = None
        # What the PROXY v2 header of each connection that carried a request named.
        self.proxied = set()

    def start(self):
        node = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
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

            def reply(self, status, body):
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def answer(self):
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                path, _, query = self.path.partition("?")
                if path == "/readyz":
                    return self.reply(200 if node.ready else 503, b"ready" if node.ready else b"not ready")
                with node.lock:
                    node.proxied.add(self.proxy_client)
                    node.seen[self.command] = node.seen.get(self.command, 0) + 1
                if node.mode == "close":
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if node.mode == "503":
                    return self.reply(503, b'{"error":"shutting down"}')
                if "wait_ms=" in query:
                    time.sleep(int(query.split("wait_ms=", 1)[1].split("&", 1)[0]) / 1000)
                self.reply(200, json.dumps({"node": node.name}).encode())

            do_GET = answer
            do_POST = answer

        self.server = QuietServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()
        with self.lock:
            for conn in list(self.conns):
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            self.conns.clear()

    def reset(self):
        with self.lock:
            self.seen = {"GET": 0, "POST": 0}


def request(port, method, path, body=None):
    """One request on a fresh connection: (status, body)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def node_of(port, method, path, body=None):
    status, data = request(port, method, path, body)
    if status != 200:
        raise AssertionError(f"{method} {path}: expected 200, got {status}: {data[:200]!r}")
    return json.loads(data)["node"]


def check(cond, message):
    if not cond:
        raise AssertionError(message)


def wait_for(what, cond, deadline_s=15.0):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def run(front, nodes):
    a, b = nodes
    names = {a.name, b.name}
    wait_for("both nodes up in HAProxy",
             lambda: {node_of(front, "GET", "/v1/boxes/k") for _ in range(6)} == names)

    # 1. One key's polls and ingests, and batches, reach both nodes.
    got = [node_of(front, "GET", "/v1/boxes/box-1") for _ in range(40)]
    got += [node_of(front, "POST", "/v1/boxes/box-1", '{"value":1}') for _ in range(20)]
    got += [node_of(front, "POST", "/v1/ingest", '[{"key":"a","value":1}]') for _ in range(20)]
    share = {n: got.count(n) for n in names}
    check(all(v >= 10 for v in share.values()), f"requests not spread over the nodes: {share}")
    print(f"  one key's polls, ingests and batches spread over both nodes: {share}")
    check_metrics_refused(lambda path: request(front, "GET", path), nodes, "replicas")
    print("  /metrics refused (404) by the load balancer, no node asked")

    # 2. Least connections: a long-poll held on one node sends the next requests
    # to the other.
    held = {}

    def long_poll():
        held["node"] = node_of(front, "GET", "/v1/boxes/box-1?after=1&wait_ms=1500")

    t = threading.Thread(target=long_poll)
    t.start()
    time.sleep(0.3)
    nxt = [node_of(front, "GET", "/v1/boxes/box-2") for _ in range(5)]
    t.join()
    busy = held["node"]
    check(busy not in nxt, f"with a long-poll held on {busy}, requests still went to it: {nxt}")
    print(f"  a long-poll held on {busy}: the next requests went to the other node")

    # 3. A node that is not ready (catching up) gets nothing until it is.
    b.ready = False
    wait_for(f"{b.name} marked down", lambda: all(node_of(front, "GET", "/v1/boxes/k") == a.name for _ in range(6)))
    b.reset()
    for _ in range(20):
        node_of(front, "GET", "/v1/boxes/k")
    check(b.seen["GET"] == 0, f"{b.name} is not ready and got {b.seen['GET']} requests")
    b.ready = True
    wait_for(f"{b.name} back", lambda: b.name in {node_of(front, "GET", "/v1/boxes/k") for _ in range(6)})
    print(f"  {b.name} unready (/readyz 503): no requests; ready again: requests")

    # 4. A stopped node (not yet seen down by the checks): nothing fails.
    b.stop()
    for i in range(20):
        check(node_of(front, "GET", "/v1/boxes/k") == a.name, "GET went nowhere")
        check(node_of(front, "POST", "/v1/boxes/k", '{"value":1}') == a.name, "POST went nowhere")
    print(f"  {b.name} stopped: every GET and POST answered by {a.name}")
    b.start()
    wait_for(f"{b.name} back", lambda: b.name in {node_of(front, "GET", "/v1/boxes/k") for _ in range(6)})

    # 5. A node that fails after the request was sent: GET retried elsewhere,
    # POST not retried.
    for mode, post_status in (("close", 502), ("503", 503)):
        b.mode = mode
        a.reset()
        b.reset()
        for _ in range(10):
            check(node_of(front, "GET", "/v1/boxes/k") == a.name, f"GET with {b.name} in mode {mode}")
        check(b.seen["GET"] >= 1, f"{b.name} (mode {mode}) got no GET: the retry path was not exercised")
        statuses = []
        for _ in range(10):
            statuses.append(request(front, "POST", "/v1/boxes/k", '{"value":1}')[0])
        failed = statuses.count(post_status)
        check(failed == b.seen["POST"] and failed >= 1,
              f"mode {mode}: {b.name} saw {b.seen['POST']} POSTs, clients got {statuses}")
        check(all(s in (200, post_status) for s in statuses), f"mode {mode}: POST statuses {statuses}")
        print(f"  {b.name} answering {'nothing' if mode == 'close' else '503'}: GETs retried on {a.name} "
              f"({b.seen['GET']} retried), POSTs not retried ({failed} of 10 got {post_status})")
        b.mode = "ok"

    # 6. Every request came on a connection that began with a PROXY v2 header
    # naming the client (send-proxy-v2: pollbox's per-client limits see it).
    proxied = a.proxied | b.proxied
    check(proxied == {"127.0.0.1"}, f"PROXY v2 headers named {proxied} (None: no header)")
    print("  every request came on a connection whose PROXY v2 header named the client")


def main():
    if not os.path.exists(CONFIG):
        print(f"missing {CONFIG}", file=sys.stderr)
        return 1
    nodes = [StubNode("node1", free_port()), StubNode("node2", free_port())]
    front = free_port()
    env = dict(os.environ, FRONT_PORT=str(front),
               NODE1=f"127.0.0.1:{nodes[0].port}", NODE2=f"127.0.0.1:{nodes[1].port}")
    for n in nodes:
        n.start()
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(["haproxy", "-db", "-f", CONFIG], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for("haproxy to listen", lambda: proc.poll() is None and _connects(front), 10)
        run(front, nodes)
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
    print("haproxy replicas smoke test: ok")
    return 0


def _connects(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


if __name__ == "__main__":
    sys.exit(main())
