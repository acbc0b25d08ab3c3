// The floor under a server's answer: a server that does nothing but count the
// requests a read brings ("\r\n\r\n") and write that many copies of a fixed
// answer, head and body, with one writev of iovecs that all point at the same
// bytes (no copy in user space: what a zero-copy send queue would do at best).
// Everything else a server does (parsing, routing, rendering) costs nothing here,
// so the difference between two answers' CPU per request is what their bytes
// alone cost the kernel.
//
// Each connection answers with ANSWER_A, unless its first request's line holds
// the byte string MARK (then ANSWER_B) — benches/rooms/presence-read.sh gives it
// pollbox's own answers to a box poll and to a presence page.
//
//   cc -O2 -o answer-floor benches/rooms/answer-floor.c
//   ./answer-floor PORT ANSWER_A_FILE ANSWER_B_FILE MARK
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#define MAX_FDS 65536
#define MAX_IOV 1024

struct conn {
  int answer;       // 0: not known yet, 1: A, 2: B
  int matched;      // bytes of "\r\n\r\n" matched at the end of the last read
  char *pending;    // bytes a short write left (copied), sent before anything new
  size_t pending_len;
  size_t owed;      // answers counted while bytes were pending
};

static struct conn conns[MAX_FDS];
static char *answers[3];
static size_t answer_len[3];

static char *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) { perror(path); exit(1); }
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = malloc((size_t)n);
  if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) { perror(path); exit(1); }
  fclose(f);
  *len = (size_t)n;
  return buf;
}

// Send `n` answers of `c` (after what is pending). Returns -1 if the connection failed.
static int send_answers(int fd, struct conn *c, size_t n) {
  if (c->pending_len > 0) {
    c->owed += n;
    ssize_t w = write(fd, c->pending, c->pending_len);
    if (w < 0) return errno == EAGAIN ? 0 : -1;
    memmove(c->pending, c->pending + w, c->pending_len - (size_t)w);
    c->pending_len -= (size_t)w;
    if (c->pending_len > 0) return 0;
    n = c->owed;
    c->owed = 0;
  }
  const char *a = answers[c->answer];
  size_t len = answer_len[c->answer];
  struct iovec iov[MAX_IOV];
  while (n > 0) {
    size_t k = n < MAX_IOV ? n : MAX_IOV;
    for (size_t i = 0; i < k; i++) { iov[i].iov_base = (void *)a; iov[i].iov_len = len; }
    ssize_t w = writev(fd, iov, (int)k);
    if (w < 0 && errno != EAGAIN) return -1;
    if (w < 0) w = 0;
    size_t total = k * len;
    n -= k;
    if ((size_t)w < total) {
      // Keep the rest (and the answers still owed) for the next EPOLLOUT.
      size_t rest = total - (size_t)w + n * len;
      c->pending = realloc(c->pending, rest);
      size_t off = (size_t)w % len, at = 0;
      for (size_t left = rest; left > 0;) {
        size_t part = len - off < left ? len - off : left;
        memcpy(c->pending + at, a + off, part);
        at += part; left -= part; off = 0;
      }
      c->pending_len = rest;
      return 0;
    }
  }
  return 0;
}

int main(int argc, char **argv) {
  if (argc != 5) { fprintf(stderr, "usage: %s PORT ANSWER_A ANSWER_B MARK\n", argv[0]); return 2; }
  answers[1] = slurp(argv[2], &answer_len[1]);
  answers[2] = slurp(argv[3], &answer_len[2]);
  const char *mark = argv[4];
  int ls = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  int one = 1;
  setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((unsigned short)atoi(argv[1])),
                           .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  if (bind(ls, (struct sockaddr *)&sa, sizeof sa) || listen(ls, 4096)) { perror("listen"); return 1; }
  int ep = epoll_create1(0);
  struct epoll_event ev = {.events = EPOLLIN, .data.fd = ls};
  epoll_ctl(ep, EPOLL_CTL_ADD, ls, &ev);
  static char buf[65536];
  struct epoll_event events[256];
  for (;;) {
    int n = epoll_wait(ep, events, 256, -1);
    for (int i = 0; i < n; i++) {
      int fd = events[i].data.fd;
      if (fd == ls) {
        int c;
        while ((c = accept4(ls, NULL, NULL, SOCK_NONBLOCK)) >= 0) {
          if (c >= MAX_FDS) { close(c); continue; }
          setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
          memset(&conns[c], 0, sizeof conns[c]);
          struct epoll_event ce = {.events = EPOLLIN | EPOLLOUT | EPOLLET, .data.fd = c};
          epoll_ctl(ep, EPOLL_CTL_ADD, c, &ce);
        }
        continue;
      }
      struct conn *c = &conns[fd];
      size_t count = 0;
      int closed = 0;
      for (;;) {
        ssize_t r = read(fd, buf, sizeof buf);
        if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) { closed = 1; break; }
        if (r < 0) break;
        if (c->answer == 0) c->answer = memmem(buf, (size_t)r, mark, strlen(mark)) ? 2 : 1;
        static const char end[4] = {'\r', '\n', '\r', '\n'};
        for (ssize_t j = 0; j < r; j++) {
          if (buf[j] == end[c->matched]) {
            if (++c->matched == 4) { count++; c->matched = 0; }
          } else {
            c->matched = buf[j] == '\r' ? 1 : 0;
          }
        }
      }
      if (!closed && (count > 0 || c->pending_len > 0) && send_answers(fd, c, count) < 0) closed = 1;
      if (closed) {
        free(c->pending);
        memset(c, 0, sizeof *c);
        close(fd);
      }
    }
  }
}
