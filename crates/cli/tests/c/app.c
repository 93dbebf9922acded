/* A small instrumented program for the CLI tests: a few functions called
 * often enough to be sampled, a line of output, and the exit status given
 * as its first argument. -DSPIN=N makes `spin` do N steps a call (a build
 * with a slowed function, for `report --diff`). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static volatile long sink;

#ifndef SPIN
#define SPIN 2000
#endif

__attribute__((noinline)) static long fib(int n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }

__attribute__((noinline)) static void spin(long n) {
    for (long i = 0; i < n; i++) sink += i;
}

__attribute__((noinline)) long work(int round) {
    spin(SPIN);
    return fib(12 + round % 3);
}

int main(int argc, char **argv) {
    long total = 0;
    /* APP_RAISE=N: signal N to itself halfway, then a pause in which an
     * on-demand report can be written. Parsed on every run, so that every
     * site of an inlined atoi runs whether it is set or not. */
    const char *raise_at = getenv("APP_RAISE");
    int sig = atoi(raise_at ? raise_at : "0");
    for (int r = 0; r < 3000; r++) {
        total += work(r);
        if (r == 1500 && sig > 0) {
            raise(sig);
            struct timespec ts = {0, 300 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
    }
    printf("total %ld\n", total);
    return argc > 1 ? atoi(argv[1]) : 0;
}
