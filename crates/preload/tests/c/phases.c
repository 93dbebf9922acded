/* A function called in two phases that alternate: a dense one of many
 * short calls and a sparse one of few long calls, about as long in time.
 * Almost every call is short; about half the time is spent where calls
 * are long. Timing the first calls after a random instant finds the
 * sparse phase about half the time, and so reads a mean many times the
 * mean of all calls; a sample in which every call is as likely as any
 * other does not. stdout says how many calls were made (deterministic). */
#include <stdio.h>
#include "spin.h"

#define ROUNDS 200
#define DENSE 10000
#define SPARSE 40

__attribute__((noinline)) void work(int slow) {
    if (slow)
        spin_ns(2000);
    else
        sink += chain(sink, 200);
}

int main(void) {
    for (int r = 0; r < ROUNDS; r++) {
        for (int i = 0; i < DENSE; i++) work(0);
        for (int i = 0; i < SPARSE; i++) {
            spin_ns(20000);
            work(1);
        }
    }
    printf("work called %d times\n", ROUNDS * (DENSE + SPARSE));
    return 0;
}
