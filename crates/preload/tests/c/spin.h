/* A clock and a spin on it, and a fixed chain of work, for test programs
 * whose functions must take a known time. */
#ifndef FASTINST_TEST_SPIN_H
#define FASTINST_TEST_SPIN_H
#include <time.h>

static volatile long sink;

static long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000L + t.tv_nsec;
}

static void spin_ns(long ns) {
    long end = now_ns() + ns;
    while (now_ns() < end) sink++;
}

/* A chain of dependent arithmetic (x = 3x + 1, n times): work of a fixed
 * length, no calls, no memory. Written out, with its loop at the start of
 * a cache line: where a compiler put such a loop, its branch fell on a
 * 64-byte boundary, and there it ran at one speed or at half of it, in
 * stretches of tens of milliseconds, with or without the profiler loaded
 * (measured: docs/profiler.md), so two runs of it could differ by twice.
 * (Before, a loop on a volatile in memory had run at one speed or another
 * as well.) */
static inline long chain(long x, long n) {
    __asm__ volatile(".p2align 6\n"
                     "1: lea 1(%0, %0, 2), %0\n"
                     "dec %1\n"
                     "jnz 1b"
                     : "+r"(x), "+r"(n));
    return x;
}
#endif
