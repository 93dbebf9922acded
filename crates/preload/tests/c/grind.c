/* One long call of fixed work, timed by the program itself: `grind` runs
 * a chain of dependent arithmetic (no calls, no memory) for about 0.3 s
 * and main prints the chain's result and, on stderr, the call's length
 * in nanoseconds as main measured it around the call. With the argument
 * `own-trap` main first installs a SIGTRAP handler of its own (a
 * debugger's runtime, say), after any preloaded library has started. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include "spin.h"

static void on_trap(int sig) { (void)sig; }

__attribute__((noinline)) long grind(long x, long n) { return chain(x, n); }

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "own-trap") == 0) signal(SIGTRAP, on_trap);
    long t0 = now_ns();
    long x = grind(1, 400000000L);
    long t1 = now_ns();
    printf("grind %ld\n", x);
    fprintf(stderr, "grind took %ld ns\n", t1 - t0);
    return 0;
}
