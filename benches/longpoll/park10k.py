#!/usr/bin/env python3
"""Park N long-polls on a running pollbox and report what they cost.

    python3 benches/longpoll/park10k.py http://127.0.0.1:8080 10000

Reads RSS and accounted buffers from /metrics before and after parking N polls
(one connection each, `?after=0&wait_ms=30000` on keys that do not exist yet),
then wakes a tenth of them with ingests and checks those answer 200.
"""
import re, socket, sys, time, urllib.request

url = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8080"
n = int(sys.argv[2]) if len(sys.argv) > 2 else 10000
host, port = url.removeprefix("http://").split(":")
port = int(port)

def metrics():
    text = urllib.request.urlopen(url + "/metrics").read().decode()
    def get(name):
        m = re.search(r"^" + re.escape(name) + r" (\S+)$", text, re.M)
        return float(m.group(1)) if m else 0.0
    return {
        "rss": get("process_resident_memory_bytes"),
        "buffers": get('pollbox_accounted_bytes{part="buffers"}'),
        "jemalloc": get("pollbox_jemalloc_allocated_bytes"),
        "parked": get("pollbox_parked_polls"),
        "open": get("pollbox_connections_open"),
    }

before = metrics()
socks = []
for i in range(n):
    s = socket.create_connection((host, port))
    s.sendall(f"GET /v1/boxes/lp-{i % 1000}?after=0&wait_ms=30000 HTTP/1.1\r\nHost: t\r\n\r\n".encode())
    socks.append(s)
for _ in range(100):
    m = metrics()
    if m["parked"] >= n:
        break
    time.sleep(0.1)
after = metrics()
print(f"parked polls: {after['parked']:.0f} on {after['open']:.0f} connections")
for k in ("rss", "jemalloc", "buffers"):
    d = after[k] - before[k]
    print(f"{k:9s} +{d / 1048576:7.1f} MiB  = {d / n:7.0f} bytes per parked poll")
# Wake the polls of 100 keys (a tenth of the connections).
for k in range(100):
    body = b'{"value":1}'
    urllib.request.urlopen(urllib.request.Request(f"{url}/v1/boxes/lp-{k}", data=body, method="POST")).read()
ok = 0
for i, s in enumerate(socks):
    if i % 1000 < 100:
        s.settimeout(5)
        if s.recv(4096).startswith(b"HTTP/1.1 200"):
            ok += 1
print(f"woken and answered 200: {ok} of {sum(1 for i in range(n) if i % 1000 < 100)}")
for s in socks:
    s.close()
