/* Drives the C API from an instrumented program linked with -lfastinst:
 * deactivate every probe at discovery, check no deactivated site reaches
 * the hook again, reactivate with a counting handler and check exact
 * counts, then toggle every probe at a high rate from one thread while 4
 * threads run, and check the results and the counts afterwards.
 * argv[1]: strategy. Prints "ok ..." on success; exits non-zero otherwise. */
#include "fastinst.h"
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAXP 4096
static _Atomic unsigned long hits[MAXP];
static fastinst_probe_id ids[MAXP];
static _Atomic int nids;

#define CHECK(c, ...) do { if (!(c)) { fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
    fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); exit(1); } } while (0)

__attribute__((no_instrument_function)) static void on_probe(const fastinst_probe_meta *m, void *u) {
    (void)u;
    /* Discovery callbacks run one at a time; the toggler reads ids[i] for
     * i < nids, so the id is stored before nids counts it. */
    int i = atomic_load(&nids);
    CHECK(i < MAXP && m->id < MAXP, "too many probes");
    ids[i] = m->id;
    atomic_store(&nids, i + 1);
    int rc = fastinst_deactivate(m->id);
    CHECK(rc == 0, "deactivate %u: %s", m->id, fastinst_strerror(rc));
}

__attribute__((no_instrument_function)) static void ignore(const fastinst_probe_meta *m, void *u) {
    (void)m;
    (void)u;
}

__attribute__((no_instrument_function)) static void count(fastinst_probe_id id) {
    atomic_fetch_add_explicit(&hits[id], 1, memory_order_relaxed);
}

__attribute__((noinline)) int leaf(int x) { return x * 3 + 1; }
__attribute__((noinline)) int mid(int x) { return leaf(x) + leaf(x + 1); }
__attribute__((noinline)) long work(int n) {
    long s = 0;
    for (int i = 0; i < n; i++) s += mid(i);
    return s;
}

__attribute__((no_instrument_function)) static long expected(int n) {
    long s = 0;
    for (int i = 0; i < n; i++) s += (i * 3 + 1) + ((i + 1) * 3 + 1);
    return s;
}

__attribute__((no_instrument_function)) static unsigned long hits_of(void *fn, int kind) {
    unsigned long h = 0;
    for (int i = 0; i < nids; i++) {
        fastinst_probe_meta m;
        CHECK(fastinst_probe_info(ids[i], &m) == 0, "probe_info");
        if (m.function == fn && m.kind == kind) h += hits[m.id];
    }
    return h;
}

__attribute__((no_instrument_function)) static void activate_all(void) {
    for (int i = 0; i < nids; i++) {
        int rc = fastinst_activate(ids[i], count);
        CHECK(rc == 0, "activate %u: %s", ids[i], fastinst_strerror(rc));
    }
}

static _Atomic int stop;
static _Atomic long bad;

static void *runner(void *arg) {
    (void)arg;
    while (!atomic_load(&stop))
        if (work(100) != expected(100)) atomic_fetch_add(&bad, 1);
    return NULL;
}

__attribute__((no_instrument_function)) static void *toggler(void *arg) {
    unsigned long *toggles = arg;
    while (!atomic_load(&stop)) {
        for (int i = 0; i < nids; i++) {
            int rc = fastinst_deactivate(ids[i]);
            CHECK(rc == 0, "deactivate: %s", fastinst_strerror(rc));
            rc = fastinst_activate(ids[i], count);
            CHECK(rc == 0, "activate: %s", fastinst_strerror(rc));
            *toggles += 2;
        }
    }
    return NULL;
}

int main(int argc, char **argv) {
    const char *strategy = argc > 1 ? argv[1] : "flip";
    int rc = fastinst_set_strategy(strategy);
    CHECK(rc == 0, "set_strategy %s: %s", strategy, fastinst_strerror(rc));
    CHECK(fastinst_set_strategy("bogus") == FASTINST_EINVAL, "bogus strategy accepted");
    CHECK(fastinst_activate(999999, count) == FASTINST_ENOPROBE, "missing probe accepted");
    /* Every error path, each with its exact code. */
    CHECK(fastinst_activate(0, NULL) == FASTINST_EINVAL, "null handler accepted");
    CHECK(fastinst_set_strategy(NULL) == FASTINST_EINVAL, "null strategy name accepted");
    CHECK(fastinst_deactivate(999999) == FASTINST_ENOPROBE, "deactivate of a missing probe");
    CHECK(fastinst_is_active(999999) == FASTINST_ENOPROBE, "is_active of a missing probe");
    CHECK(fastinst_inactive_hits(999999) == FASTINST_ENOPROBE, "inactive_hits of a missing probe");
    fastinst_probe_meta none;
    CHECK(fastinst_probe_info(999999, &none) == FASTINST_ENOPROBE, "probe_info of a missing probe");
    CHECK(fastinst_probe_info(0, NULL) == FASTINST_EINVAL, "probe_info into NULL");
    CHECK(fastinst_get_stats(NULL) == FASTINST_EINVAL, "get_stats into NULL");
    CHECK(fastinst_activate_function((void *)expected, count) == FASTINST_ENOFUNCTION,
          "activate_function of an uninstrumented function");
    CHECK(fastinst_deactivate_function((void *)expected) == FASTINST_ENOFUNCTION,
          "deactivate_function of an uninstrumented function");
    CHECK(fastinst_activate_function((void *)expected, NULL) == FASTINST_EINVAL, "activate_function, null handler");
    CHECK(fastinst_on_discovery(NULL, NULL) == FASTINST_EINVAL, "null discovery callback accepted");
    rc = fastinst_on_discovery(on_probe, NULL);
    CHECK(rc == 0, "on_discovery: %s", fastinst_strerror(rc));
    /* The runtime holds at most 16 discovery callbacks (a tool may hold
     * some): registering more ends in exactly FASTINST_ECALLBACKS. */
    int more = 0;
    while ((rc = fastinst_on_discovery(ignore, NULL)) == 0 && more < 32) more++;
    CHECK(rc == FASTINST_ECALLBACKS && more < 16, "callback %d: %d (%s)", more, rc, fastinst_strerror(rc));

    /* Phase 1: every probe is deactivated at discovery. */
    CHECK(work(50) == expected(50), "work wrong while deactivating");
    CHECK(work(50) == expected(50), "work wrong while off");
    int patched = 0;
    for (int i = 0; i < nids; i++) {
        fastinst_probe_meta m;
        CHECK(fastinst_probe_info(ids[i], &m) == 0, "probe_info %u", ids[i]);
        CHECK(fastinst_is_active(ids[i]) == 0, "probe %u still active", ids[i]);
        if (m.form == FASTINST_FORM_UNRECOGNISED) continue;
        patched++;
        long long h = fastinst_inactive_hits(ids[i]);
        CHECK(h >= 0 && h <= 1, "site of probe %u (%s) reached the hook %lld times while off", ids[i], m.function_name, h);
    }

    /* Phase 2: reactivation restores the calls, counted exactly. */
    activate_all();
    CHECK(work(1000) == expected(1000), "work wrong while on");
    CHECK(hits_of((void *)leaf, FASTINST_ENTRY) == 2000, "leaf entries %lu", hits_of((void *)leaf, FASTINST_ENTRY));
    CHECK(hits_of((void *)leaf, FASTINST_EXIT) == 2000, "leaf exits %lu", hits_of((void *)leaf, FASTINST_EXIT));
    CHECK(hits_of((void *)mid, FASTINST_ENTRY) == 1000, "mid entries");
    CHECK(hits_of((void *)mid, FASTINST_EXIT) == 1000, "mid exits");
    CHECK(fastinst_deactivate_function((void *)leaf) == 2, "deactivate_function(leaf)");
    memset(hits, 0, sizeof hits);
    work(10);
    CHECK(hits_of((void *)leaf, FASTINST_ENTRY) == 0 && hits_of((void *)mid, FASTINST_ENTRY) == 10, "by function");
    CHECK(fastinst_activate_function((void *)leaf, count) == 2, "activate_function(leaf)");

    /* Phase 3: a toggler flips every probe while 4 threads run. */
    pthread_t t[4], tg;
    unsigned long toggles = 0;
    for (int i = 0; i < 4; i++) pthread_create(&t[i], NULL, runner, NULL);
    pthread_create(&tg, NULL, toggler, &toggles);
    struct timespec d = {0, 300 * 1000 * 1000};
    nanosleep(&d, NULL);
    atomic_store(&stop, 1);
    for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
    pthread_join(tg, NULL);
    CHECK(bad == 0, "%ld wrong results under toggling", (long)bad);
    activate_all();
    memset(hits, 0, sizeof hits);
    CHECK(work(1000) == expected(1000), "work wrong after toggling");
    CHECK(hits_of((void *)leaf, FASTINST_ENTRY) == 2000 && hits_of((void *)mid, FASTINST_EXIT) == 1000,
          "counts after toggling: leaf %lu mid %lu", hits_of((void *)leaf, FASTINST_ENTRY),
          hits_of((void *)mid, FASTINST_EXIT));
    fastinst_stats st = {.size = 4};
    CHECK(fastinst_get_stats(&st) == FASTINST_EINVAL, "get_stats without its size");
    st.size = sizeof st;
    CHECK(fastinst_get_stats(&st) == 0 && st.size == sizeof st, "get_stats");
    /* An older, shorter struct is filled only as far as it goes. */
    struct { uint64_t size, probes; uint64_t guard; } old = {16, 0, 0xfeedULL};
    CHECK(fastinst_get_stats((fastinst_stats *)&old) == 0 && old.size == 16 && old.probes == st.probes &&
              old.guard == 0xfeedULL,
          "get_stats into an older struct");
    printf("ok strategy=%s probes=%d patched=%d toggles=%lu rewritten=%llu unrecognised=%llu\n", fastinst_strategy(),
           nids, patched, toggles, (unsigned long long)st.arg_rewritten, (unsigned long long)st.unrecognised);
    return 0;
}
