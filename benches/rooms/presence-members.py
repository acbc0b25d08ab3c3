"""Hold N presence connections to a room (docs/presence.md): N event streams of
ROOM~presence, each with member=m-<i>, opened from this process and kept open
until it is killed. Usage: presence-members.py PORT ROOM N

Each source address 127.0.0.x takes at most 20,000 of them (one address has about
28,000 ephemeral ports towards one server port), so 100,000 members fit; the
process needs N file descriptors (`ulimit -n`)."""
import resource
import select
import socket
import sys

port, room, n = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
PER_SOURCE = 20000
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
if soft < n + 100:
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(n + 100, hard), hard))
held = {}
ep = select.epoll()
for i in range(n):
    source = ("127.0.0.%d" % (1 + i // PER_SOURCE), 0)
    s = socket.create_connection(("127.0.0.1", port), source_address=source)
    s.sendall(
        f"GET /v1/boxes/{room}~presence?member=m-{i:06d} HTTP/1.1\r\nHost: b\r\n"
        "Accept: text/event-stream\r\n\r\n".encode()
    )
    s.setblocking(False)
    held[s.fileno()] = s
    ep.register(s.fileno(), select.EPOLLIN)
while True:
    # Read what the streams are sent (their events), so none is held back.
    for fd, _ in ep.poll(1.0):
        try:
            if held[fd].recv(65536):
                continue
        except BlockingIOError:
            continue
        except OSError:
            pass
        # Ended by the server: no longer watched (nor present).
        ep.unregister(fd)
        held.pop(fd).close()
