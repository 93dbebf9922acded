/* A clock and a spin on it, for test programs whose functions must take
 * a known time. */
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
#endif
