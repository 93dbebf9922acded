/* Windows that open and close at every phase of the calls, for the re-arm
 * races: four threads call eight functions in turn, each spinning a
 * different fraction of a microsecond to a few, so each function's window
 * opens or closes on one thread while the others are about to enter or
 * leave it, at no fixed point of the sampler's short epochs. Every function is called
 * THREADS x ROUNDS times; stdout says so (deterministic). */
#include <pthread.h>
#include <stdio.h>
#include "spin.h"

#define THREADS 4
#define ROUNDS 5000

#define F(i) __attribute__((noinline)) void f##i(void) { spin_ns(500L * (i + 1)); }
F(0) F(1) F(2) F(3) F(4) F(5) F(6) F(7)

static void *work(void *arg) {
    for (int r = 0; r < ROUNDS; r++) {
        f0(); f1(); f2(); f3(); f4(); f5(); f6(); f7();
    }
    return arg;
}

int main(void) {
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++) pthread_create(&t[i], NULL, work, NULL);
    for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
    printf("each of f0..f7 called %d times\n", THREADS * ROUNDS);
    return 0;
}
