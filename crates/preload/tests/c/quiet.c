/* A service's day: a quiet stretch (a request every 10 ms, each a handful
 * of calls, sleeping between), a busy burst, another quiet stretch. The
 * profiler has windows to open and close in the burst alone. stdout says
 * how many calls of `hot` the burst made (deterministic); stderr how long
 * the burst took (`burst_ms`). */
#include <stdio.h>
#include <time.h>
#include "spin.h"

#define HOT 40000000

__attribute__((noinline)) void hot(int i) { sink += i; }
__attribute__((noinline)) void handle(int i) { sink += i * 3; }

static void quiet(int requests) {
    struct timespec ten_ms = {0, 10 * 1000 * 1000};
    for (int r = 0; r < requests; r++) {
        for (int k = 0; k < 4; k++) handle(r + k);
        nanosleep(&ten_ms, NULL);
    }
}

int main(void) {
    quiet(80);
    long t0 = now_ns();
    for (int i = 0; i < HOT; i++) hot(i);
    fprintf(stderr, "burst_ms %.3f\n", (now_ns() - t0) / 1e6);
    quiet(80);
    printf("hot called %d times\n", HOT);
    return 0;
}
