/* A profiled function (`work`) whose calls run two others (`mid`, which
 * calls `leaf`) that a filter leaves out. Built with
 * -finstrument-functions, each of the three and `main` has one entry and
 * one exit hook call. stdout is deterministic. */
#include <stdio.h>

static volatile long sink;

__attribute__((noinline)) void leaf(long i) { sink += i; }
__attribute__((noinline)) void mid(long i) {
    leaf(i);
    leaf(i + 1);
}
__attribute__((noinline)) void work(long n) {
    for (long i = 0; i < n; i++) mid(i);
}

int main(void) {
    for (int k = 0; k < 20; k++) work(100000);
    printf("%ld\n", (long)sink);
    return 0;
}
