#!/usr/bin/env python3
"""Smoke test for deploy/haproxy/haproxy-k8s.cfg: its TLS + HTTP/2 listener, its
retries, and event streams multiplexed over HTTP/2.

Runs the real HAProxy with haproxy-k8s.cfg made local: the listeners on loopback
ports, the three pod names replaced by loopback nodes, and the certificate
directory by a throwaway one laid out as Kubernetes mounts a TLS Secret (tls.crt
and tls.key, links into a hidden ..data directory), with a self-signed certificate.
Clients are curl --http2 (TLS, ALPN) and plain HTTP/1.1.

With stub nodes (from smoke_test.py), always:
- ALPN picks HTTP/2 on the TLS port, and each of 50 keys reaches the same node over
  TLS/HTTP/2 as over plain HTTP/1.1;
- a node that closes without answering: a GET over HTTP/2 is retried on the same
  node (200), a POST and a long-poll are not re-sent (502, seen once);
- a stopped node: its keys answer 503 and are not re-hashed onto the others;
- /metrics is refused with 404 by HAProxy on both listeners, no node asked.
With POLLBOX_BIN set, against three real pollbox nodes as well:
- an ingest and a poll over HTTP/2 (HTTP/2 200, the payload);
- 8 event streams on one HTTP/2 connection (a browser allows 6 HTTP/1.1
  connections per origin) each get their box, its update, and the end on DELETE.

Needs python3, haproxy, openssl and curl (with HTTP/2) on PATH. Exits 0 on
success, 1 with a message otherwise.
"""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from smoke_test import StubNode, check, check_metrics_refused, free_port, once, wait_for_port  # noqa: E402

CONFIG = os.environ.get("SMOKE_HAPROXY_CFG") or os.path.join(HERE, "haproxy-k8s.cfg")
STREAMS = 8


def localize(text, front, tls, stats, certdir, node_ports):
    """haproxy-k8s.cfg with loopback listeners, nodes and certificate directory."""
    subs = [
        (r"^(\s*bind) :8000$", rf"\g<1> 127.0.0.1:{front}", 1),
        (r"^(\s*bind) :8443 ssl crt /etc/haproxy/certs/ ", rf"\g<1> 127.0.0.1:{tls} ssl crt {certdir}/ ", 1),
        (r"^(\s*bind) :8404$", rf"\g<1> 127.0.0.1:{stats}", 1),
    ]
    for pattern, repl, want in subs:
        text, n = re.subn(pattern, repl, text, flags=re.M)
        check(n == want, f"{CONFIG}: expected {want} line(s) matching {pattern!r}, found {n}")
    pods = re.compile(r'"pollbox-(\d+)\.pollbox\.\$\{POLLBOX_NAMESPACE\}\.svc\.cluster\.local:8080"')
    found = sorted({int(m) for m in pods.findall(text)})
    check(found == list(range(len(node_ports))), f"{CONFIG}: pods {found}, expected 0..{len(node_ports) - 1}")
    return pods.sub(lambda m: f"127.0.0.1:{node_ports[int(m.group(1))]}", text)


def make_cert_dir(root):
    """A TLS Secret as the kubelet mounts it: tls.crt and tls.key are links into
    ..data, itself a link to a timestamped directory (HAProxy skips dot files)."""
    certs = os.path.join(root, "certs")
    data = os.path.join(certs, "..2026_01_01_00_00_00.000000000")
    os.makedirs(data)
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost",
                    "-keyout", os.path.join(data, "tls.key"), "-out", os.path.join(data, "tls.crt")],
                   check=True, capture_output=True)
    os.symlink(os.path.basename(data), os.path.join(certs, "..data"))
    for f in ("tls.crt", "tls.key"):
        os.symlink(os.path.join("..data", f), os.path.join(certs, f))
    return certs


def curl(url, method="GET", body=None, extra=()):
    """One request over TLS with ALPN h2 on a new connection: (http_version, status, body)."""
    args = ["curl", "-sS", "-k", "--http2", "--max-time", "10", "-X", method,
            "-w", "\n%{http_version} %{http_code}", *extra]
    if body is not None:
        args += ["-H", "Content-Type: application/json", "--data-binary", body]
    out = subprocess.run(args + [url], capture_output=True, text=True, timeout=15)
    check(out.returncode == 0, f"curl {method} {url}: exit {out.returncode}: {out.stderr.strip()}")
    data, _, tail = out.stdout.rpartition("\n")
    version, code = tail.split()
    return version, int(code), data


def with_stubs(front, tls, nodes):
    base = f"https://127.0.0.1:{tls}"
    # 1. HTTP/2 over TLS, and the same ring as the plain listener.
    owner = {}
    for i in range(50):
        key = f"k8s-{i}"
        status, data = once(front, "GET", f"/v1/boxes/{key}")
        check(status == 200, f"plain GET {key}: {status} {data[:120]!r}")
        version, code, body = curl(f"{base}/v1/boxes/{key}")
        check(version == "2", f"TLS GET {key}: HTTP/{version}, expected HTTP/2 (ALPN h2)")
        check(code == 200, f"TLS GET {key}: {code} {body[:120]!r}")
        a, b = json.loads(data)["node"], json.loads(body)["node"]
        check(a == b, f"{key}: plain HTTP reached {a}, TLS/HTTP/2 reached {b}")
        owner[key] = a
    share = {n.name: sum(1 for v in owner.values() if v == n.name) for n in nodes}
    check(all(share.values()), f"a node got no keys: {share}")
    print(f"  TLS listener speaks HTTP/2 (ALPN h2); 50 keys reach one node over TLS/HTTP/2 and plain HTTP; share {share}")
    check_metrics_refused(lambda path: once(front, "GET", path), nodes, "plain HTTP")
    check_metrics_refused(lambda path: curl(base + path)[1:], nodes, "TLS/HTTP/2")
    print("  /metrics refused (404) by the load balancer over plain HTTP and TLS/HTTP/2, no node asked")

    # 2. Retries: a GET once more on the key's node, a POST or a long-poll not at
    #    all. Over TLS with HTTP/1.1 on a new connection: to an HTTP/2 client
    #    HAProxy refuses the stream instead of a 502 (not processed), and curl,
    #    like browsers, then re-sends by itself, which would hide HAProxy's part.
    node = nodes[0]
    key = next(k for k, v in owner.items() if v == node.name)
    for method, path, body, want, sent in (
            ("GET", f"/v1/boxes/{key}", None, 200, 2),
            ("POST", f"/v1/boxes/{key}", json.dumps({"value": 1}), 502, 1),
            ("GET", f"/v1/boxes/{key}?after=1&wait_ms=25", None, 502, 1)):
        before = dict(node.seen)
        node.close_next = 1
        version, code, data = curl(base + path, method, body, ["--http1.1"])
        check(code == want, f"{method} {path} with one closed connection: expected {want}, got {code} {data[:120]!r}")
        if want == 200:
            check(json.loads(data)["node"] == node.name, f"{method} {path}: retried on another node")
        got = node.seen[method] - before[method]
        check(got == sent, f"{method} {path}: {node.name} saw it {got} times, expected {sent}")
        check(node.close_next == 0, f"{method} {path}: never reached {node.name}")
    print("  a connection closed unanswered: GET retried on its key's node; POST and long-poll not re-sent (502)")

    # 3. A stopped node's keys fail; no other node gets them.
    dead = nodes[1]
    dead.stop()
    others = {n.name: dict(n.seen) for n in nodes if n is not dead}
    dead_keys = [k for k, v in owner.items() if v == dead.name][:5]
    for key in dead_keys:
        version, code, data = curl(f"{base}/v1/boxes/{key}")
        check(code == 503, f"{key} (on stopped {dead.name}): expected 503, got {code} {data[:120]!r}")
    for n in nodes:
        if n is not dead:
            check(n.seen == others[n.name], f"{n.name} got requests for {dead.name}'s keys")
    print(f"  {dead.name} stopped: its keys answer 503 over TLS, none re-hashed")


def with_pollbox(tls):
    base = f"https://127.0.0.1:{tls}"
    # 4. Ingest and poll over HTTP/2, through HAProxy to HTTP/1.1 nodes.
    keys = [f"k8s-sse-{i}" for i in range(STREAMS)]
    for key in keys:
        version, code, data = curl(f"{base}/v1/boxes/{key}", "POST", json.dumps({"value": 1}))
        check((version, code) == ("2", 200), f"POST {key} over TLS: HTTP/{version} {code} {data[:200]!r}")
        version, code, data = curl(f"{base}/v1/boxes/{key}")
        check((version, code) == ("2", 200) and f'"k":"{key}"' in data,
              f"GET {key} over TLS: HTTP/{version} {code} {data[:200]!r}")
    print(f"  pollbox: ingest and poll of {len(keys)} keys over HTTP/2, HTTP/2 200 with the payload")

    # 5. Event streams, all multiplexed on one HTTP/2 connection (curl --parallel
    #    waits for the first connection and adds the others as streams on it).
    tmp = tempfile.mkdtemp()
    outs = [os.path.join(tmp, f"stream{i}") for i in range(STREAMS)]
    args = ["curl", "-sS", "-k", "--http2", "-N", "--parallel", "--parallel-max", str(STREAMS),
            "--max-time", "20", "-H", "Accept: text/event-stream",
            "-w", "%{num_connects} %{http_version} %{http_code}\n"]
    for key, out in zip(keys, outs):
        args += [f"{base}/v1/boxes/{key}", "-o", out]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        def wait_all(what):
            # `what`: a string each stream must have got, or a test of its text.
            has = what if callable(what) else (lambda t: what in t)
            end = time.monotonic() + 10
            while time.monotonic() < end:
                texts = [open(o).read() if os.path.exists(o) else "" for o in outs]
                if all(has(t) for t in texts):
                    return
                if proc.poll() is not None:
                    raise AssertionError(f"curl ended early: {proc.communicate()[1]}")
                time.sleep(0.05)
            missing = [k for k, o in zip(keys, outs) if not os.path.exists(o) or not has(open(o).read())]
            raise AssertionError(f"streams of {missing} did not get {what!r}")

        def events(n):
            # n events with increasing ids (a new box's first version is the
            # clock's, so ids are read, not assumed).
            def test(text):
                ids = [int(line[4:]) for line in text.split("\n") if line.startswith("id: ")]
                return len(ids) >= n and ids == sorted(set(ids)) and "\ndata: " in "\n" + text
            return test

        wait_all(events(1))
        for key in keys:
            version, code, data = curl(f"{base}/v1/boxes/{key}", "POST", json.dumps({"value": 2}))
            check(code == 200, f"POST {key}: {code} {data[:120]!r}")
        wait_all(events(2))
        for key in keys:
            version, code, data = curl(f"{base}/v1/boxes/{key}", "DELETE")
            check(code == 204, f"DELETE {key}: {code} {data[:120]!r}")
        wait_all("event: deleted\n")
        out, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    check(proc.returncode == 0, f"curl (event streams) exit {proc.returncode}: {err.strip()}")
    lines = [line.split() for line in out.splitlines() if line.strip()]
    check(len(lines) == STREAMS and all(v == "2" and c == "200" for _, v, c in lines),
          f"event streams: expected {STREAMS} HTTP/2 200, got {lines}")
    connects = sum(int(n) for n, _, _ in lines)
    check(connects == 1, f"{STREAMS} event streams used {connects} connections, expected 1 (HTTP/2 multiplexing)")
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"  pollbox: {STREAMS} event streams on one HTTP/2 connection: each got its box, the update, the end on DELETE")


def start_haproxy(text, tmp, front):
    cfg = os.path.join(tmp, "haproxy.cfg")
    with open(cfg, "w") as f:
        f.write(text)
    log = tempfile.TemporaryFile()
    env = dict(os.environ, POLLBOX_NAMESPACE="default", HAPROXY_THREADS="1")
    proc = subprocess.Popen(["haproxy", "-db", "-f", cfg], env=env, stdout=log, stderr=subprocess.STDOUT)
    wait_for_port(front, proc)
    return proc, log


def stop(proc):
    if proc is None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def tail(log):
    if log is None:
        return ""
    log.seek(0)
    return log.read()[-4000:].decode(errors="replace")


def start_pollbox(binary, port, tmp, i):
    logf = open(os.path.join(tmp, f"pollbox{i}.log"), "wb")
    # HAProxy sends PROXY v2 (send-proxy-v2): the node trusts it, on loopback.
    config = os.path.join(tmp, f"pollbox{i}.toml")
    with open(config, "w") as f:
        f.write('[server]\ntrusted_proxies = ["127.0.0.1"]\n')
    proc = subprocess.Popen([binary, "serve", "--config", config, "--listen", f"127.0.0.1:{port}", "--workers", "1"],
                            stdout=logf, stderr=subprocess.STDOUT)
    end = time.monotonic() + 10
    while time.monotonic() < end:
        check(proc.poll() is None, f"pollbox on port {port} exited with {proc.returncode}")
        try:
            if once(port, "GET", "/healthz")[0] == 200:
                return proc
        except OSError:
            pass
        time.sleep(0.05)
    proc.kill()
    raise AssertionError(f"pollbox on port {port} did not answer /healthz within 10 s")


def main():
    for tool in ("haproxy", "openssl", "curl"):
        if shutil.which(tool) is None:
            print(f"FAIL: {tool} not on PATH", file=sys.stderr)
            return 1
    if "HTTP2" not in subprocess.run(["curl", "--version"], capture_output=True, text=True).stdout:
        print("FAIL: this curl has no HTTP/2 support (nghttp2)", file=sys.stderr)
        return 1
    text = open(CONFIG).read()
    tmp = tempfile.mkdtemp()
    certs = make_cert_dir(tmp)
    proc = log = None
    nodes, pollboxes = [], []
    try:
        front, tls, stats = free_port(), free_port(), free_port()
        nodes = [StubNode(f"pollbox-{i}", free_port()) for i in range(3)]
        for n in nodes:
            n.start()
        proc, log = start_haproxy(localize(text, front, tls, stats, certs, [n.port for n in nodes]), tmp, front)
        with_stubs(front, tls, nodes)
        stop(proc)
        proc = None

        binary = os.environ.get("POLLBOX_BIN")
        if binary:
            ports = [free_port() for _ in range(3)]
            pollboxes = [start_pollbox(binary, p, tmp, i) for i, p in enumerate(ports)]
            front, tls, stats = free_port(), free_port(), free_port()
            proc, log = start_haproxy(localize(text, front, tls, stats, certs, ports), tmp, front)
            with_pollbox(tls)
        else:
            print("  (POLLBOX_BIN not set: no event streams through real pollbox nodes)")
    except (AssertionError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        print(f"FAIL: {e}\n--- haproxy output (tail) ---\n{tail(log)}", file=sys.stderr)
        return 1
    finally:
        stop(proc)
        for p in pollboxes:
            stop(p)
        for n in nodes:
            try:
                n.stop()
            except Exception:
                pass
        shutil.rmtree(tmp, ignore_errors=True)
    print("haproxy-k8s.cfg TLS/HTTP/2 smoke test: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
