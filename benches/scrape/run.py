#!/usr/bin/env python3
"""Server CPU per /metrics scrape with few and with many open connections
(a scrape's cost must not grow with the connection count).

    benches/scrape/run.py [BINARY] [SCRAPES]

Starts BINARY (default target/release/pollbox) with one worker pinned to core 0,
opens 12 and then 1,000 idle keep-alive connections, scrapes /metrics SCRAPES
times (default 100, 200 ms apart) from core 1 in each state, and prints the
server's CPU time (all threads, /proc/PID/task/*/schedstat, ns) per scrape, less what it
used over the same time without scrapes."""
import os, socket, subprocess, sys, time

binary = sys.argv[1] if len(sys.argv) > 1 else "target/release/pollbox"
scrapes = int(sys.argv[2]) if len(sys.argv) > 2 else 100
os.sched_setaffinity(0, {1})
srv = subprocess.Popen(["taskset", "-c", "0", binary, "serve", "--listen", "127.0.0.1:0",
                        "--workers", "1"], stderr=subprocess.PIPE, text=True)
line = srv.stderr.readline()
host, port = line.split("http://")[1].split()[0].split(":")
port = int(port)
tick = os.sysconf("SC_CLK_TCK")

def cpu():
    """Seconds on CPU, all the server's threads (schedstat: nanoseconds)."""
    total = 0
    for t in os.listdir(f"/proc/{srv.pid}/task"):
        try:
            with open(f"/proc/{srv.pid}/task/{t}/schedstat") as f:
                total += int(f.read().split()[0])
        except OSError:
            pass
    return total / 1e9

def scrape(s):
    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n")
    buf = b""
    while b"\r\n\r\n" not in buf:
        buf += s.recv(65536)
    head, body = buf.split(b"\r\n\r\n", 1)
    n = int([l for l in head.split(b"\r\n") if l.lower().startswith(b"content-length")][0].split(b":")[1])
    while len(body) < n:
        body += s.recv(65536)

idle = []
def measure(conns):
    while len(idle) < conns:
        c = socket.create_connection((host, port))
        idle.append(c)
    time.sleep(0.5)
    s = socket.create_connection((host, port))
    # jemalloc's epoch advances at most every 200 ms: pace the scrapes so that
    # every one pays for it, as a scraper would every few seconds.
    # The server's own CPU over the same time without scrapes (ticks), taken off.
    before = cpu()
    time.sleep(0.2 * scrapes)
    quiet = cpu() - before
    before = cpu()
    for _ in range(scrapes):
        scrape(s)
        time.sleep(0.2)
    used = cpu() - before - quiet
    s.close()
    return used / scrapes * 1e6

results = [(n, measure(n)) for n in (12, 1000)]
for n, us in results:
    print(f"{n:>5} open connections: {us:8.1f} µs of server CPU per scrape ({scrapes} scrapes, 200 ms apart, idle CPU taken off)")
print(f"ratio 1000 / 12: {results[1][1] / results[0][1]:.2f}")
srv.terminate()
srv.wait()
