/* Recursion whose sampled calls outlast their windows, as an interpreter's
 * do: `descend` recurses DEPTH levels deep and spins at the bottom, and
 * main descends ROUNDS times. A window's sampled calls are a run of levels
 * of one descent, and they return only after every level under them has
 * been entered and has returned. stdout says how many calls were made
 * (deterministic). */
#include <stdio.h>
#include "spin.h"

#define DEPTH 200
#define ROUNDS 10000

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
