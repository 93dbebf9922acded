/* A single-threaded program with hot calls: the profiler's sampler must
 * re-open windows all through it without making glibc think the process is
 * multi-threaded. On stderr at the end: glibc's single-threaded flag and
 * the number of threads the kernel lists. */
#include "task_count.h"
#include <stdio.h>
#include <sys/single_threaded.h>
#include <time.h>

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

__attribute__((noinline)) unsigned long hot(unsigned long x) { return x * 2654435761u + 1; }
__attribute__((noinline)) unsigned long warm(unsigned long x) { return hot(x) ^ hot(x >> 3); }


int main(void) {
    unsigned long s = 0;
    double t0 = now_ms();
    while (now_ms() - t0 < 300)
        for (int i = 0; i < 1000; i++)
            s += warm(s + i);
    printf("%lu\n", s & 1);
    fprintf(stderr, "single-threaded: %d, threads: %d\n", __libc_single_threaded, task_count());
    return 0;
}
