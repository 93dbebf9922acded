/* One burst of short calls to a function never called before, between two
 * quiet stretches: the function starts counted whole, passes its epoch's
 * count at once, and the burst is over long before the epoch is. The
 * quiet start outlasts the profiler's short first epoch by far, even when
 * a loaded machine runs its sampler late. stdout says how many calls were
 * made (deterministic). */
#include <stdio.h>
#include "spin.h"

#define CALLS 300000

__attribute__((noinline)) void hot(int i) { sink += i; }

int main(void) {
    spin_ns(60 * 1000 * 1000);
    for (int i = 0; i < CALLS; i++) hot(i);
    spin_ns(30 * 1000 * 1000);
    printf("hot called %d times\n", CALLS);
    return 0;
}
