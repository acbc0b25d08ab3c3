#!/usr/bin/env python3
"""The kernel's floor for an SSE fan-out: a server that does nothing per delivery
but one send() on the subscriber's socket.

Speaks just enough of pollbox's protocol for fanout.py (--server pollbox --kind
sse): `GET /v1/boxes/{key}` with `Accept: text/event-stream` gets the head and,
if the key exists, its event; `POST /v1/boxes/{key}` is answered 200 (after the
fan-out, like Nchan) and sends `id: N\\ndata: {...}\\n\\n` to every subscriber of
the key, one send() each. Its system time per delivery (fanout.py's
`system_us_per_delivery`) is what the kernel charges any server for one event on
one loopback TCP socket; its user time is Python's and means nothing.

  python3 floor.py PORT
"""
import selectors
import socket
import sys

HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
        b"Connection: close\r\n\r\nretry: 1000\n\n")


def main(port):
    sel = selectors.DefaultSelector()
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", port))
    ls.listen(4096)
    ls.setblocking(False)
    sel.register(ls, selectors.EVENT_READ, None)
    subs = {}  # key -> [socket]
    boxes = {}  # key -> (version, payload)
    bufs = {}

    def event(key):
        ver, payload = boxes[key]
        return b"id: %d\ndata: %s\n\n" % (ver, payload)

    while True:
        for k, _ in sel.select():
            if k.data is None:
                while True:
                    try:
                        c, _ = ls.accept()
                    except BlockingIOError:
                        break
                    c.setblocking(False)
                    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    bufs[c] = b""
                    sel.register(c, selectors.EVENT_READ, "conn")
                continue
            c = k.fileobj
            try:
                data = c.recv(65536)
            except (BlockingIOError, ConnectionError):
                data = b"" if not isinstance(sys.exc_info()[1], BlockingIOError) else None
            if data is None:
                continue
            if not data:
                sel.unregister(c)
                bufs.pop(c, None)
                for lst in subs.values():
                    if c in lst:
                        lst.remove(c)
                c.close()
                continue
            bufs[c] += data
            while True:
                buf = bufs[c]
                i = buf.find(b"\r\n\r\n")
                if i < 0:
                    break
                head = buf[:i].decode("latin-1")
                lines = head.split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                hdrs = {l.split(":", 1)[0].lower(): l.split(":", 1)[1].strip() for l in lines[1:] if ":" in l}
                n = int(hdrs.get("content-length", "0"))
                if len(buf) < i + 4 + n:
                    break
                body = buf[i + 4:i + 4 + n]
                bufs[c] = buf[i + 4 + n:]
                key = path.split("?")[0].rsplit("/", 1)[-1]
                if method == "GET" and "text/event-stream" in hdrs.get("accept", ""):
                    out = HEAD + (event(key) if key in boxes else b"")
                    c.send(out)
                    subs.setdefault(key, []).append(c)
                elif method == "POST":
                    ver = boxes.get(key, (0, b""))[0] + 1
                    payload = b'{"k":"%s","ver":%d,"b":%s}' % (key.encode(), ver, body)
                    boxes[key] = (ver, payload)
                    ev = event(key)
                    for s in subs.get(key, ()):
                        try:
                            s.send(ev)
                        except OSError:
                            pass
                    c.send(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                           % (len(payload), payload))
                else:
                    c.send(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")


if __name__ == "__main__":
    main(int(sys.argv[1]))
