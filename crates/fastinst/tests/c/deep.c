/* Recursion whose sampled calls outlast their windows, as an interpreter's
 * do: `descend` recurses DEPTH levels deep and spins at the bottom, and
 * main descends ROUNDS times. A window's sampled calls are a run of levels
 * of one descent, and they return only after every level under them has
 * been entered and has returned. stdout says how many calls were made
 * (deterministic). */
#include <stdio.h>
#include <time.h>

#define DEPTH 200
#define ROUNDS 10000

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

__attribute__((noinline)) long descend(int d) {
    if (d == 0) {
        spin_ns(50000);
        return 1;
    }
    long r = descend(d - 1);
    sink += r;
    return r + 1;
}

int main(void) {
    long total = 0;
    for (int i = 0; i < ROUNDS; i++) total += descend(DEPTH);
    printf("descend called %ld times, returned %ld\n", (long)ROUNDS * (DEPTH + 1), total);
    return 0;
}
