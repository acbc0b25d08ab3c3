#!/usr/bin/env python3
"""Redis beside `pollbox load -c 16 -R RATE --mix ingest:100`: single 512 B SETs,
open loop at RATE a second over CONNECTIONS connections (each its share of the
rate, on a fixed schedule), each answer's latency counted from its intended send
time, as pollbox load counts it (no coordinated omission). Writes a JSON report with
the fields benches/wal/speed.sh reads from pollbox load's: messages_per_s,
errors_total, latency_ms {p50, p99}.

  redis-single.py PORT RATE SECONDS WARMUP_S CONNECTIONS OUT.json
"""
import json
import socket
import sys
import threading
import time

port, rate, secs, warmup, conns, out = sys.argv[1:]
port, rate, secs, warmup, conns = int(port), float(rate), float(secs), float(warmup), int(conns)
value = b"x" * 512
lat = []
errors = [0]
lock = threading.Lock()
start = time.monotonic() + 0.2
end = start + warmup + secs


def command(i):
    key = b"k-%d" % (i % 10000)
    return b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (len(key), key, len(value), value)


def run(c):
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    every = conns / rate
    n, mine = 0, []
    t = start + c * (1.0 / rate)
    while t < end:
        now = time.monotonic()
        if t > now:
            time.sleep(t - now)
        s.sendall(command(n * conns + c))
        reply = b""
        while not reply.endswith(b"\r\n"):
            part = s.recv(64)
            if not part:
                raise SystemExit("redis closed the connection")
            reply += part
        done = time.monotonic()
        if t >= start + warmup:
            if reply.startswith(b"+OK"):
                mine.append(done - t)
            else:
                with lock:
                    errors[0] += 1
        n += 1
        t += every
    with lock:
        lat.extend(mine)


threads = [threading.Thread(target=run, args=(c,)) for c in range(conns)]
for th in threads:
    th.start()
for th in threads:
    th.join()
lat.sort()


def pct(p):
    return lat[min(len(lat) - 1, int(p / 100 * len(lat)))] * 1e3 if lat else 0.0


json.dump(
    {
        "messages_per_s": len(lat) / secs,
        "errors_total": errors[0],
        "latency_ms": {"p50": pct(50), "p99": pct(99)},
    },
    open(out, "w"),
)
