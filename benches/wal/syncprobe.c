/*
 * syncprobe: the disk's sync latency, the floor of a write-ahead file's answer, for
 * benches/wal/speed.sh. Appends BYTES (default 4096) to a new file in DIR and calls
 * fdatasync, again and again for SECONDS, each sync timed apart; prints one line:
 *
 *   syncs N mean_ms M p50_ms A p90_ms B p99_ms C max_ms D syncs_per_s S cpu_us_per_sync U
 *
 * (U: this process's user + system time over the loop, per sync: what a sync costs the
 * CPU, the kernel's side of it included.)
 *
 *   cc -O2 -o syncprobe syncprobe.c && ./syncprobe DIR SECONDS [BYTES]
 *
 * The file is appended to, as a segment is (pollbox-wal writes a group with one write
 * and syncs with fdatasync), and removed at the end.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    if (argc < 3 || argc > 4) {
        fprintf(stderr, "usage: %s DIR SECONDS [BYTES]\n", argv[0]);
        return 2;
    }
    double seconds = atof(argv[2]);
    size_t bytes = argc == 4 ? strtoul(argv[3], NULL, 10) : 4096;
    char path[4096];
    snprintf(path, sizeof path, "%s/syncprobe.%d", argv[1], (int)getpid());
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0600);
    if (fd < 0) { perror(path); return 1; }
    char *buf = malloc(bytes);
    for (size_t i = 0; i < bytes; i++) buf[i] = (char)(i * 131 + 7);
    size_t cap = 1 << 20, n = 0;
    double *lat = malloc(cap * sizeof *lat), sum = 0;
    struct rusage u0, u1;
    getrusage(RUSAGE_SELF, &u0);
    double end = now_ms() + seconds * 1e3, t0 = now_ms();
    while (now_ms() < end && n < cap) {
        double a = now_ms();
        if (write(fd, buf, bytes) != (ssize_t)bytes) { perror("write"); return 1; }
        if (fdatasync(fd) != 0) { perror("fdatasync"); return 1; }
        lat[n] = now_ms() - a;
        sum += lat[n++];
    }
    double wall = now_ms() - t0;
    getrusage(RUSAGE_SELF, &u1);
#define US(t) ((t).tv_sec * 1e6 + (t).tv_usec)
    double cpu_us = US(u1.ru_utime) - US(u0.ru_utime) + US(u1.ru_stime) - US(u0.ru_stime);
    close(fd);
    unlink(path);
    qsort(lat, n, sizeof *lat, cmp);
#define P(q) lat[(size_t)((q) * (n - 1))]
    printf("syncs %zu mean_ms %.4f p50_ms %.4f p90_ms %.4f p99_ms %.4f max_ms %.4f syncs_per_s %.1f cpu_us_per_sync %.1f\n",
           n, sum / n, P(0.5), P(0.9), P(0.99), lat[n - 1], n / (wall / 1e3), cpu_us / n);
    return 0;
}
