/* Functions whose code gcc clones or splits, for the profiler's inlined-copy
 * test. At -O3 with -finstrument-functions:
 * - scale() is called with k == 3 from check() and with other values from
 *   main(): check calls a specialised clone, scale.constprop.0, whose hooks
 *   pass scale's address from outside scale's own symbol;
 * - check()'s unlikely error path is moved to check.cold.
 * stdout is deterministic. */
#include <stdio.h>
#include <stdlib.h>

static volatile long sink;

__attribute__((noinline)) static long scale(long x, long k, long unused) {
    long s = 0;
    for (long i = 0; i < k * 10000; i++) s += x ^ (i * k);
    sink += s;
    return s;
}

__attribute__((cold, noinline)) static void complain(long x) {
    fprintf(stderr, "negative %ld\n", x);
}

__attribute__((noinline)) long check(long x) {
    if (__builtin_expect(x < 0, 0)) {
        complain(x);
        sink += x * 7;
        return -1;
    }
    return scale(x, 3, 0) + 1;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 30000, t = 0;
    for (long i = 0; i < n; i++) t += check(i);
    t += scale(n, argc + 4, 1);
    printf("%ld\n", t);
    return 0;
}
