/* A known call tree with known durations, for the profiler's accuracy test.
 *
 *   main -> worker (x argv[1] threads, default 1, via pthread)
 *   worker -> step  (argv[2] calls per thread, default ROUNDS)
 *   step   -> leaf  (2 calls), own spin SELF_US
 *   step   -> nap   (1 call in NAP_EVERY), nanosleep NAP_US
 *   leaf   -> spin LEAF_US
 *
 * Spins read CLOCK_MONOTONIC, so durations are wall time whatever the load.
 * Prints the expected numbers for the test to compare with the report, and
 * each nap's measured duration's exact median: on a loaded machine some
 * naps wake late by milliseconds, so their mean is no median's reference.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define MAX_THREADS 16
#define ROUNDS 8000

static int rounds = ROUNDS;
#define LEAF_US 20
#define SELF_US 10
#define NAP_EVERY 100
#define NAP_US 2000

static double __attribute__((no_instrument_function, patchable_function_entry(0, 0))) now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static void __attribute__((noinline, no_instrument_function, patchable_function_entry(0, 0))) spin(double us) {
    double end = now_us() + us;
    while (now_us() < end) {
    }
}

void __attribute__((noinline)) leaf(void) { spin(LEAF_US); }

void __attribute__((noinline)) nap(void) {
    struct timespec t = {0, NAP_US * 1000};
    nanosleep(&t, 0);
}

/* Wall time measured around the calls, in the caller: what the profiler's
 * totals must match. Per thread, summed at the end. */
static __thread double leaf_us, nap_us;
static double total_leaf_us, total_nap_us;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

/* Every nap's duration, for the exact median; past MAX_NAPS the rest go
 * unrecorded and the median is not printed. */
#define MAX_NAPS (1 << 16)
static double naps[MAX_NAPS];
static unsigned nnaps;

static int __attribute__((no_instrument_function)) by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void __attribute__((noinline)) step(int i) {
    double t = now_us();
    leaf();
    leaf_us += now_us() - t;
    spin(SELF_US);
    t = now_us();
    leaf();
    leaf_us += now_us() - t;
    if (i % NAP_EVERY == 0) {
        t = now_us();
        nap();
        double d = now_us() - t;
        nap_us += d;
        unsigned k = __atomic_fetch_add(&nnaps, 1, __ATOMIC_RELAXED);
        if (k < MAX_NAPS)
            naps[k] = d;
    }
}

void *__attribute__((noinline)) worker(void *arg) {
    (void)arg;
    for (int i = 0; i < rounds; i++)
        step(i);
    pthread_mutex_lock(&lock);
    total_leaf_us += leaf_us;
    total_nap_us += nap_us;
    pthread_mutex_unlock(&lock);
    return 0;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 1;
    if (argc > 2)
        rounds = atoi(argv[2]);
    if (threads < 1 || threads > MAX_THREADS || rounds < 1)
        return 2;
    pthread_t t[MAX_THREADS];
    for (int i = 0; i < threads; i++)
        pthread_create(&t[i], 0, worker, 0);
    for (int i = 0; i < threads; i++)
        pthread_join(t[i], 0);
    const int THREADS = threads;
    printf("expect leaf calls %d us %d\n", THREADS * rounds * 2, LEAF_US);
    printf("expect step calls %d\n", THREADS * rounds);
    printf("expect nap calls %d us %d\n", THREADS * rounds / NAP_EVERY, NAP_US);
    printf("expect worker calls %d\n", THREADS);
    /* Measured, so it varies: stderr, not the output compared. */
    fprintf(stderr, "measured leaf total_us %.0f nap total_us %.0f", total_leaf_us, total_nap_us);
    if (nnaps > 0 && nnaps <= MAX_NAPS) {
        /* The profiler's rank: sorted index round((n - 1) / 2). */
        qsort(naps, nnaps, sizeof naps[0], by_value);
        fprintf(stderr, " nap p50_us %.1f", naps[(unsigned)((nnaps - 1) * 0.5 + 0.5)]);
    }
    fprintf(stderr, "\n");
    return 0;
}
