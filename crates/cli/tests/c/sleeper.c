/* A program whose main thread sleeps in nanosleep while it is attached:
 * with a worker thread calling an instrumented function (argv[1] = 1), or
 * alone (0), so that the attach must borrow the sleeping thread itself.
 * It prints whether the sleep returned 0 after its whole length, as it
 * does unattached. 4,096 more functions give the runtime's start enough
 * sites to run a while on the borrowed thread, long enough for it to take
 * CPU samples there (whose handlers reset the kernel's restart record). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define G(n) __attribute__((noinline, used)) unsigned g##n(unsigned x) { return x * 2654435761u + 1u; }
#define D1(n) G(n##0) G(n##1) G(n##2) G(n##3) G(n##4) G(n##5) G(n##6) G(n##7)
#define D2(n) D1(n##0) D1(n##1) D1(n##2) D1(n##3) D1(n##4) D1(n##5) D1(n##6) D1(n##7)
#define D3(n) D2(n##0) D2(n##1) D2(n##2) D2(n##3) D2(n##4) D2(n##5) D2(n##6) D2(n##7)
D3(0) D3(1) D3(2) D3(3) D3(4) D3(5) D3(6) D3(7)

static volatile int stop;
static volatile unsigned sink;

__attribute__((noinline)) unsigned step(unsigned x) { return x * 2654435761u + 1; }

static void *worker(void *a) {
    unsigned acc = (unsigned)(long)a;
    while (!stop) acc = step(acc);
    sink = acc;
    return NULL;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 0;
    unsigned acc = 0;
    for (int i = 0; i < 1000; i++) acc = step(acc);
    sink = acc;
    pthread_t t;
    if (threads) pthread_create(&t, NULL, worker, NULL);
    struct timespec ts = {3, 0};
    double t0 = now();
    int rc = nanosleep(&ts, NULL);
    double slept = now() - t0;
    stop = 1;
    if (threads) pthread_join(t, NULL);
    printf("nanosleep returned %d after its whole length: %s\n", rc, slept >= 3.0 ? "yes" : "no");
    return 0;
}
