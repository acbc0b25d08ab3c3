/* A hiccup meter: spin on one core reading CLOCK_MONOTONIC for SECONDS and count the
 * gaps between reads. On an idle, unshared core the gaps stay under a few µs; long
 * ones are time the core was taken away (hypervisor steal, interrupts), which the
 * server's tail latency on the same machine cannot be better than.
 *
 *   cc -O2 -o jitter benches/scaling/jitter.c && taskset -c 3 ./jitter 10 cpu3
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: jitter SECONDS LABEL\n");
        return 2;
    }
    const long long limits[] = {10000, 100000, 1000000, 5000000, 10000000, 20000000};
    long counts[6] = {0};
    double secs = atof(argv[1]);
    long long end = now_ns() + (long long)(secs * 1e9), prev = now_ns(), max_gap = 0, lost = 0;
    for (;;) {
        long long t = now_ns(), gap = t - prev;
        prev = t;
        if (gap > max_gap) max_gap = gap;
        if (gap > 50000) lost += gap;
        for (int i = 0; i < 6; i++)
            if (gap >= limits[i]) counts[i]++;
        if (t > end) break;
    }
    printf("cpu %s max gap %.3f ms, lost in gaps>50us %.2f ms of %.1f s; gaps >=10us %ld "
           ">=100us %ld >=1ms %ld >=5ms %ld >=10ms %ld >=20ms %ld\n",
           argv[2], max_gap / 1e6, lost / 1e6, secs, counts[0], counts[1], counts[2], counts[3],
           counts[4], counts[5]);
    return 0;
}
