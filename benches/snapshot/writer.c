/*
 * writer: the file I/O of pollbox's snapshot thread without its walk of the boxes, for
 * benches/snapshot/floor.sh: what writing a snapshot costs the polls beside it when
 * nothing but the write happens.
 *
 *   cc -O2 -o writer writer.c && nice -n 19 ./writer PATH BYTES INTERVAL_S [CHUNK]
 *
 * Every INTERVAL_S seconds (counted, as pollbox counts them, from the end of the last
 * write) it writes BYTES to PATH.tmp in CHUNK-byte write()s (default 65536: pollbox
 * writes through a 64 KiB BufWriter), fsyncs it, renames it over PATH and fsyncs the
 * folder (crates/server/src/snapshot_file.rs, write_atomic). The bytes are a fixed
 * pseudo-random block made once. Each write prints "N BYTES MS" (its number, size and
 * milliseconds) on stdout. Runs until killed.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void die(const char *what) { perror(what); exit(1); }

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

int main(int argc, char **argv) {
    if (argc < 4 || argc > 5) {
        fprintf(stderr, "usage: %s PATH BYTES INTERVAL_S [CHUNK]\n", argv[0]);
        return 2;
    }
    const char *path = argv[1];
    long long bytes = atoll(argv[2]);
    double interval = atof(argv[3]);
    size_t chunk = argc == 5 ? strtoul(argv[4], NULL, 10) : 65536;
    if (bytes <= 0 || interval <= 0 || chunk == 0) return 2;

    char tmp[4096], dir[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    snprintf(dir, sizeof dir, "%s", path);
    char *folder = dirname(dir);
    unsigned char *buf = malloc(chunk);
    if (!buf) die("malloc");
    unsigned x = 2463534242u;
    for (size_t i = 0; i < chunk; i++) { /* xorshift: bytes nothing could compress */
        x ^= x << 13, x ^= x >> 17, x ^= x << 5;
        buf[i] = (unsigned char)x;
    }
    struct timespec pause = {(time_t)interval, (long)((interval - (time_t)interval) * 1e9)};

    for (int n = 1;; n++) {
        nanosleep(&pause, NULL);
        double t0 = now_ms();
        int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0) die(tmp);
        for (long long left = bytes; left > 0;) {
            ssize_t w = write(fd, buf, left < (long long)chunk ? (size_t)left : chunk);
            if (w <= 0) die("write");
            left -= w;
        }
        if (fsync(fd) || close(fd)) die("fsync");
        if (rename(tmp, path)) die("rename");
        int dfd = open(folder, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd < 0 || fsync(dfd) || close(dfd)) die(folder);
        printf("%d %lld %.1f\n", n, bytes, now_ms() - t0);
        fflush(stdout);
    }
}
