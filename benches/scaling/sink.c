/*
 * sink: the least an HTTP/1.1 server can do for `pollbox load`, a floor to judge
 * pollbox's figures against (benches/scaling/floor.sh, benches/snapshot/floor.sh).
 *
 *   cc -O2 -pthread -o sink sink.c && ./sink PORT [THREADS]
 *
 * THREADS threads (default 1), each with its own SO_REUSEPORT listener on
 * 127.0.0.1:PORT and its own epoll loop; non-blocking, keep-alive, pipelined. Each
 * request's head is read up to its blank line and its Content-Length body is read, then
 * dropped once answered; nothing is kept. Every request gets a 200 that `pollbox load`
 * counts as pollbox's would:
 *   GET  .../KEY   a box payload of KEY (the path's last segment), {"k":"KEY","ver":1,...}
 *                  with an ETag: the generator checks the key and that "ver" never
 *                  goes backwards.
 *   POST           {"accepted":N,"rejected":0,"errors":[]} with N the messages of the
 *                  body's JSON array: the generator requires accepted + rejected to be
 *                  its batch size and counts messages/s from "accepted" (--preseed
 *                  requires N to be the keys it sent).
 * N is found cheaply: the generator's messages all have one length L, so
 * N = (Content-Length - 1) / (L + 1), where L + 1 is the offset of the comma after the
 * first message; bodies of another shape have their {"key": objects counted.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAX_HEAD 8192
#define READ_ROOM 65536

struct conn {
    int fd;
    char *in;                 /* received bytes: [start, len) not yet answered */
    size_t start, len, cap;
    char *out;                /* answers not yet sent: [sent, olen) */
    size_t sent, olen, ocap;
};

static void die(const char *what) { perror(what); exit(1); }

static void *grow(void *p, size_t *cap, size_t need) {
    if (need <= *cap) return p;
    while (*cap < need) *cap = *cap ? *cap * 2 : READ_ROOM;
    if (!(p = realloc(p, *cap))) die("realloc");
    return p;
}

static void append(struct conn *c, const char *s, size_t n) {
    c->out = grow(c->out, &c->ocap, c->olen + n);
    memcpy(c->out + c->olen, s, n);
    c->olen += n;
}

/* Messages in a batch body: see the header comment. */
static long messages(const char *b, size_t len) {
    const char *second = memmem(b, len, ",{\"key\":", 8);
    if (!second) return len > 2; /* [] or [{...}] */
    size_t l = (size_t)(second - b) - 1;
    if ((len - 1) % (l + 1) == 0) return (long)((len - 1) / (l + 1));
    long count = 0;
    for (const char *p = b; (p = memmem(p, len - (size_t)(p - b), "{\"key\":", 7)); p += 7) count++;
    return count;
}

/* Answers every complete request in c->in; returns -1 on a request it cannot frame. */
static int answer(struct conn *c) {
    char head[256], body[160];
    for (;;) {
        char *req = c->in + c->start;
        size_t have = c->len - c->start;
        char *end = memmem(req, have, "\r\n\r\n", 4);
        if (!end) break;
        size_t head_len = (size_t)(end - req) + 4, clen = 0;
        char *cl = memmem(req, head_len, "\r\nContent-Length:", 17);
        if (!cl) cl = memmem(req, head_len, "\r\ncontent-length:", 17);
        if (cl) clen = strtoul(cl + 17, NULL, 10);
        if (have < head_len + clen) { /* the body is still coming: make room for all of it */
            c->in = grow(c->in, &c->cap, c->start + head_len + clen);
            break;
        }
        int bn;
        if (req[0] == 'P') {
            bn = snprintf(body, sizeof body, "{\"accepted\":%ld,\"rejected\":0,\"errors\":[]}",
                          messages(req + head_len, clen));
        } else {
            char *path = memchr(req, ' ', head_len), *path_end = NULL, *key;
            if (path) path_end = memchr(path + 1, ' ', head_len - (size_t)(path + 1 - req));
            if (!path_end) return -1;
            for (key = path_end; key[-1] != '/' && key[-1] != ' ';) key--;
            for (char *q = key; q < path_end; q++)
                if (*q == '?') { path_end = q; break; }
            bn = snprintf(body, sizeof body, "{\"k\":\"%.*s\",\"ver\":1,\"v\":5,\"sum\":5,\"n\":1,\"by\":\"p-123\"}",
                          (int)(path_end - key), key);
        }
        int hn = snprintf(head, sizeof head,
                          "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n",
                          bn, req[0] == 'P' ? "" : "ETag: \"1\"\r\n");
        append(c, head, (size_t)hn);
        append(c, body, (size_t)bn);
        c->start += head_len + clen;
    }
    /* Keep the unanswered rest at the buffer's front. */
    size_t rest = c->len - c->start;
    if (c->start) memmove(c->in, c->in + c->start, rest);
    c->start = 0, c->len = rest;
    return rest > MAX_HEAD && !memmem(c->in, MAX_HEAD, "\r\n\r\n", 4) ? -1 : 0;
}

/* Sends what is pending; 1 if some is left (the socket is full), -1 on error. */
static int flush(struct conn *c) {
    while (c->sent < c->olen) {
        ssize_t n = send(c->fd, c->out + c->sent, c->olen - c->sent, MSG_NOSIGNAL);
        if (n < 0) return errno == EAGAIN ? 1 : -1;
        c->sent += (size_t)n;
    }
    c->sent = c->olen = 0;
    return 0;
}

static void drop(struct conn *c) {
    close(c->fd);
    free(c->in);
    free(c->out);
    free(c);
}

/* A listener of its own on 127.0.0.1:port (SO_REUSEPORT spreads connections). */
static int listener(int port) {
    int one = 1, fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((unsigned short)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) ||
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) ||
        bind(fd, (struct sockaddr *)&a, sizeof a) || listen(fd, 4096))
        die("listen");
    return fd;
}

/* One thread's event loop over its listener (arg) and the connections it accepts. */
static void *serve(void *arg) {
    int one = 1, lfd = (int)(long)arg, ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL}, evs[256];
    if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev)) die("epoll");
    for (;;) {
        int n = epoll_wait(ep, evs, 256, -1);
        if (n < 0 && errno != EINTR) die("epoll_wait");
        for (int i = 0; i < n; i++) {
            struct conn *c = evs[i].data.ptr;
            if (!c) { /* the listener */
                int fd;
                while ((fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK)) >= 0) {
                    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                    if (!(c = calloc(1, sizeof *c))) die("calloc");
                    c->fd = fd;
                    ev.events = EPOLLIN;
                    ev.data.ptr = c;
                    if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev)) die("epoll_ctl");
                }
                continue;
            }
            int bad = 0;
            if (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
                for (;;) { /* until the socket is drained or the room left unfilled */
                    c->in = grow(c->in, &c->cap, c->len + READ_ROOM);
                    size_t room = c->cap - c->len;
                    ssize_t r = recv(c->fd, c->in + c->len, room, 0);
                    if (r > 0) c->len += (size_t)r;
                    else bad = r == 0 || errno != EAGAIN;
                    if (r <= 0 || (size_t)r < room) break;
                }
                if (!bad) bad = answer(c) < 0;
            }
            int left = bad ? -1 : flush(c);
            if (left < 0) { drop(c); continue; }
            /* Wait for room to send while answers are left, else for requests. */
            ev.events = left ? EPOLLOUT : EPOLLIN;
            ev.data.ptr = c;
            if ((left || (evs[i].events & EPOLLOUT)) && epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev))
                die("epoll_ctl");
        }
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 2 || argc > 3) {
        fprintf(stderr, "usage: %s PORT [THREADS]\n", argv[0]);
        return 2;
    }
    int port = atoi(argv[1]), threads = argc == 3 ? atoi(argv[2]) : 1;
    if (port <= 0 || threads <= 0) return 2;
    /* Every listener is bound before any connection can be accepted. */
    long fds[threads];
    for (int i = 0; i < threads; i++) fds[i] = listener(port);
    pthread_t t;
    for (int i = 1; i < threads; i++)
        if (pthread_create(&t, NULL, serve, (void *)fds[i])) die("pthread_create");
    serve((void *)fds[0]);
}
