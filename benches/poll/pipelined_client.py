#!/usr/bin/env python3
"""Send N GET polls pipelined DEPTH deep on one connection and read every answer.

    pipelined_client.py PORT N DEPTH [PATH]

POLL_HEADER="Name: value" adds one header line to every request (e.g. a
bearer token: benches/auth-poll/run.sh).
With PROXY_V2_CLIENT=<IPv4> in the environment the connection starts with a
PROXY protocol v2 header naming that client (as HAProxy's send-proxy-v2 does).
"""
import os, socket, sys
extra=(os.environ["POLL_HEADER"].encode()+b"\r\n") if os.environ.get("POLL_HEADER") else b""
port=int(sys.argv[1]); n=int(sys.argv[2]); depth=int(sys.argv[3]); path=sys.argv[4] if len(sys.argv)>4 else "/v1/boxes/k"
s=socket.create_connection(("127.0.0.1",port))
if os.environ.get("PROXY_V2_CLIENT"):
    addrs=socket.inet_aton(os.environ["PROXY_V2_CLIENT"])+socket.inet_aton("127.0.0.1")+bytes([0x9c,0x40,0x1f,0x90])
    s.sendall(b"\r\n\r\n\x00\r\nQUIT\n\x21\x11"+len(addrs).to_bytes(2,"big")+addrs)
body=b'{"value":5,"player":"p-7"}'
s.sendall(b"POST /v1/boxes/k HTTP/1.1\r\nHost: t\r\n%sContent-Length: %d\r\n\r\n%s" % (extra, len(body), body)); s.recv(4096)
req=(b"GET %s HTTP/1.1\r\nHost: x\r\n%s\r\n" % (path.encode(), extra))*depth
got=0
for i in range(n//depth):
    s.sendall(req)
    need=depth
    buf=b""
    while buf.count(b"HTTP/1.1 ")<depth or not buf.endswith(b"}"):
        buf+=s.recv(65536)
