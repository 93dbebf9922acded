/* 8 threads run functions with sleds (integer, floating, varargs, x87,
 * recursion, tail calls) and check every result, while the main thread
 * switches every entry and exit probe on and off as fast as it can, in
 * the strategy named by argv[1], for argv[2] milliseconds. One sled sits
 * at each straddle split (1|4 .. 4|1). Run as a
 * FASTINST_CLIENT-free program linked with -lfastinst (the constructor
 * registers the sleds). Prints "ok toggles=T calls=C entries=E exits=X";
 * exits non-zero on any wrong result. Built with -DPG_BUILD (and -pg,
 * -pg -mfentry ...) the probes are -pg sites (provider 2), with
 * -DXRAY_BUILD (and clang -fxray-instrument) XRay sleds (provider 4); the
 * split functions are then ordinary ones: such a site cannot be placed. */
#include "fastinst.h"
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define MAXP 256
#if defined(XRAY_BUILD)
#define PROVIDER 4
#define SPLIT(k) __attribute__((noinline))
#elif defined(PG_BUILD)
#define PROVIDER 2
#define SPLIT(k) __attribute__((noinline))
#else
#define PROVIDER 1
#define SPLIT(k) __attribute__((noinline, aligned(64), patchable_function_entry(5 + 64 - k, 64 - k)))
#endif
static fastinst_probe_id ids[MAXP];
static int kinds[MAXP];
static _Atomic int nids;
static int splits[5];
static _Atomic unsigned long entries, exits;
static atomic_int stop;

#define CHECK(c, ...) do { if (!(c)) { fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
    fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); exit(1); } } while (0)

static void on_probe(const fastinst_probe_meta *m, void *u) {
    (void)u;
    int i = atomic_fetch_add(&nids, 1);
    CHECK(i < MAXP, "too many probes");
    CHECK(m->provider == PROVIDER && m->form == FASTINST_FORM_SLED, "probe %u is not a sled probe", m->id);
    ids[i] = m->id;
    kinds[i] = m->kind;
    if (m->kind == FASTINST_ENTRY && m->split < 5) splits[m->split]++;
}
static void on_entry(fastinst_probe_id id) { (void)id; atomic_fetch_add_explicit(&entries, 1, memory_order_relaxed); }
static void on_exit_p(fastinst_probe_id id) { (void)id; atomic_fetch_add_explicit(&exits, 1, memory_order_relaxed); }

__attribute__((noinline)) int leaf(int x) { return x * 3 + 1; }
__attribute__((noinline)) int mid(int x) { return leaf(x) + leaf(x + 1); }
__attribute__((noinline)) int tail(int x) { return mid(x + 2); }
__attribute__((noinline)) int rec(int n) { return n <= 0 ? 0 : n + rec(n - 1); }
__attribute__((noinline)) double dmix(double a, double b, double c) { return a * 0.5 + b * 0.25 + c; }
__attribute__((noinline)) long double lhalf(long double x) { return x / 2; }
__attribute__((noinline)) long vsum(int n, ...) {
    va_list ap;
    va_start(ap, n);
    long s = 0;
    for (int i = 0; i < n; i++) s += (i % 2) ? (long)va_arg(ap, double) : va_arg(ap, int);
    va_end(ap);
    return s;
}

/* One sled at each straddle split: the entry lies 64 - k bytes into a
 * 64-byte aligned patchable area, so its 5 bytes put k before the line. */
SPLIT(1) int split1(int x) { return x + 1; }
SPLIT(2) int split2(int x) { return x + 2; }
SPLIT(3) int split3(int x) { return x + 3; }
SPLIT(4) int split4(int x) { return x + 4; }

static _Atomic unsigned long calls;

static void *worker(void *arg) {
    long k = (long)arg;
    unsigned long n = 0;
    while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
        int x = (int)((n + k) % 1000);
        CHECK(mid(x) == (x * 3 + 1) + ((x + 1) * 3 + 1), "mid(%d)", x);
        CHECK(tail(x) == mid(x + 2), "tail(%d)", x);
        CHECK(rec(x % 40) == (x % 40) * (x % 40 + 1) / 2, "rec(%d)", x % 40);
        CHECK(dmix(x, 4.0, 0.5) == x * 0.5 + 1.5, "dmix(%d)", x);
        CHECK(lhalf((long double)x) == (long double)x / 2, "lhalf(%d)", x);
        CHECK(vsum(4, x, 2.0, x, 3.0) == 2L * x + 5, "vsum(%d)", x);
        CHECK(split1(x) + split2(x) + split3(x) + split4(x) == 4 * x + 10, "split(%d)", x);
        n++;
    }
    atomic_fetch_add(&calls, n * 13);
    return NULL;
}

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

int main(int argc, char **argv) {
    const char *strategy = argc > 1 ? argv[1] : "flip";
    double ms = argc > 2 ? atof(argv[2]) : 500;
    CHECK(fastinst_set_strategy(strategy) == 0, "strategy %s", strategy);
    CHECK(fastinst_on_discovery(on_probe, NULL) == 0, "on_discovery");
    CHECK(nids >= 14, "only %d sled probes", (int)nids);
    pthread_t t[8];
    for (long i = 0; i < 8; i++) pthread_create(&t[i], NULL, worker, (void *)i);
    unsigned long toggles = 0;
    double end = now_ms() + ms;
    while (now_ms() < end) {
        for (int i = 0; i < nids; i++) {
            int rc = fastinst_activate(ids[i], kinds[i] == FASTINST_ENTRY ? on_entry : on_exit_p);
            CHECK(rc == 0, "activate %u: %s", ids[i], fastinst_strerror(rc));
        }
        for (int i = 0; i < nids; i++) {
            /* Leave some on for a while, so threads run both forms. */
            if ((toggles / nids + i) % 3 == 0) continue;
            int rc = fastinst_deactivate(ids[i]);
            CHECK(rc == 0, "deactivate %u: %s", ids[i], fastinst_strerror(rc));
        }
        toggles += 2 * nids;
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < 8; i++) pthread_join(t[i], NULL);
    for (int i = 0; i < nids; i++) fastinst_deactivate(ids[i]);
    CHECK(entries > 0 && exits > 0, "no probe fired (%lu entries, %lu exits)", (unsigned long)entries,
          (unsigned long)exits);
    printf("ok toggles=%lu calls=%lu entries=%lu exits=%lu splits=%d,%d,%d,%d,%d\n", toggles,
           (unsigned long)calls, (unsigned long)entries, (unsigned long)exits, splits[0], splits[1], splits[2],
           splits[3], splits[4]);
    return 0;
}
