"""Hold N presence connections to a room (docs/presence.md): N event streams of
ROOM~presence, each with member=m-<i>, opened from this process and kept open
until it is killed. Usage: presence-members.py PORT ROOM N"""
import socket
import sys
import time

port, room, n = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
held = []
for i in range(n):
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(
        f"GET /v1/boxes/{room}~presence?member=m-{i:06d} HTTP/1.1\r\nHost: b\r\n"
        "Accept: text/event-stream\r\n\r\n".encode()
    )
    s.setblocking(False)
    held.append(s)
while True:
    # Read what the streams are sent (their events), so none is held back.
    for s in held:
        try:
            s.recv(65536)
        except BlockingIOError:
            pass
    time.sleep(0.5)
