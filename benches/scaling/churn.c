/*
 * churn: a new connection for every request, for benches/scaling/churn.sh (what placing
 * connections by load costs where connections are short-lived).
 *
 *   cc -O2 -pthread -o churn churn.c && ./churn PORT THREADS SECONDS
 *
 * Each thread connects, sends `GET /healthz` with `Connection: close`, reads the answer
 * to its end and closes (with a reset, so the client keeps no TIME_WAIT), until SECONDS
 * have passed; prints connections/s and the failures (a connection or answer not 200).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static int port;
static double until;
static atomic_long done, failed;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static void *run(void *arg) {
    (void)arg;
    static const char req[] = "GET /healthz HTTP/1.1\r\nHost: churn\r\nConnection: close\r\n\r\n";
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    char buf[4096];
    while (now() < until) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        struct linger l = {1, 0}; /* RST on close: no TIME_WAIT pile-up on the client */
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
        int ok = connect(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
                 write(fd, req, sizeof req - 1) == (ssize_t)(sizeof req - 1);
        ssize_t n = ok ? read(fd, buf, sizeof buf) : -1;
        ok = n > 12 && memcmp(buf, "HTTP/1.1 200", 12) == 0;
        while (n > 0) n = read(fd, buf, sizeof buf);
        atomic_fetch_add(ok ? &done : &failed, 1);
        close(fd);
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s PORT THREADS SECONDS\n", argv[0]);
        return 2;
    }
    port = atoi(argv[1]);
    int threads = atoi(argv[2]);
    double secs = atof(argv[3]);
    until = now() + secs;
    pthread_t t[256];
    for (int i = 0; i < threads && i < 256; i++) pthread_create(&t[i], NULL, run, NULL);
    for (int i = 0; i < threads && i < 256; i++) pthread_join(t[i], NULL);
    printf("%.0f connections/s, %ld failed\n", atomic_load(&done) / secs, atomic_load(&failed));
    return 0;
}
