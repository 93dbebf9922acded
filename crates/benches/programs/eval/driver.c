/* The measuring driver of `fastinst-eval` (the paper's section 8).
 *
 * Not instrumented itself. It is linked with
 *   - field.c:     generated functions built with -finstrument-functions
 *                  -falign-functions=1 (two call sites per function, at
 *                  every offset of a cache line),
 *   - hot.c:       `hot`, built with -finstrument-functions,
 *   - sledfield.c: SLED_N generated functions, built with
 *                  -fpatchable-function-entry=5 -falign-functions=1 (so some
 *                  sleds straddle a cache line),
 *   - sledhot.c:   `sled_hot`, a sled function at its usual alignment,
 * and with libfastinst.so, and drives their probes through the C API.
 *
 * Every subcommand prints JSON objects, one per line, on stdout; times are
 * TSC ticks. Operations cheaper than the TSC's step (26 ticks on a VM) are
 * timed in batches and divided.
 *
 *   driver table2 REPS      passes over every probe per strategy and class;
 *                           invocation costs beside a static guard
 *   driver fig10 N          latencies of deactivating then re-activating N
 *                           probes, about 10% of them straddlers, after
 *                           one untimed round
 *   driver fig11 STRATEGY MODE RATE_HZ THREADS MS
 *                           calls through `hot` on THREADS executors while a
 *                           toggler switches its entry probe RATE_HZ times a
 *                           second; MODE aa (handler a <-> handler b),
 *                           ad (active <-> inactive), on, off (no toggler)
 */
#define _GNU_SOURCE
#include "fastinst.h"
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <x86intrin.h>

extern void (*const field_fns[])(void);
extern const int field_n;
extern void (*const sled_fns[])(void);
extern const int sled_n;
void hot(void);
void sled_hot(void);

#define NI __attribute__((noinline, no_instrument_function))

NI static uint64_t now(void) {
    unsigned aux;
    _mm_lfence();
    uint64_t t = __rdtscp(&aux);
    _mm_lfence();
    return t;
}

/* ---- probes, as the discovery callback reports them ---- */

typedef struct {
    fastinst_probe_id id;
    int straddles;
    int sled;
    int kind;
} probe;

static probe *probes;
static int n_probes, cap_probes;
static fastinst_probe_id hot_entry = UINT32_MAX, hot_exit = UINT32_MAX, sled_entry = UINT32_MAX,
                         sled_exit = UINT32_MAX;
static int hot_split = -1, sled_split = -1;

NI static void on_probe(const fastinst_probe_meta *m, void *u) {
    (void)u;
    if (m->function == (const void *)hot) {
        if (m->kind == FASTINST_ENTRY) hot_entry = m->id, hot_split = m->split;
        else hot_exit = m->id;
        return;
    }
    if (m->function == (const void *)sled_hot) {
        if (m->kind == FASTINST_ENTRY) sled_entry = m->id, sled_split = m->split;
        else sled_exit = m->id;
        return;
    }
    if (m->site == NULL) return; /* unrecognised: never patched */
    /* A sled's two probes share its code: its entry probe toggles it. */
    if (m->provider == 1 && m->kind != FASTINST_ENTRY) return;
    if (n_probes == cap_probes) {
        cap_probes = cap_probes ? 2 * cap_probes : 4096;
        probes = realloc(probes, cap_probes * sizeof *probes);
        if (!probes) abort();
    }
    probes[n_probes++] = (probe){m->id, m->split != 0, m->provider == 1, m->kind};
}

NI static void empty_handler(fastinst_probe_id id) { (void)id; }

NI static void check(int rc, const char *what) {
    if (rc < 0) {
        fprintf(stderr, "driver: %s: %s\n", what, fastinst_strerror(rc));
        exit(1);
    }
}

NI static void discover(void) {
    check(fastinst_on_discovery(on_probe, NULL), "on_discovery");
    hot();
    sled_hot();
    /* -finstrument-functions probes are found when their hooks first run. */
    for (int i = 0; i < field_n; i++) field_fns[i]();
    if (hot_entry == UINT32_MAX || sled_entry == UINT32_MAX) {
        fprintf(stderr, "driver: the hot functions' probes were not discovered\n");
        exit(1);
    }
}

NI static void print_samples(const char *key, const double *v, int n) {
    printf(",\"%s\":[", key);
    for (int i = 0; i < n; i++) printf("%s%.2f", i ? "," : "", v[i]);
    printf("]");
}

static const char *const strategies[] = {"flip", "paper", "word-sync", "word-async"};

/* ---- Table 2 ---- */

#define BATCH 1000
static volatile int guard_flag[1 << 16];
static void (*guard_fn[1 << 16])(fastinst_probe_id);

NI void plain_fn(void) { __asm__ volatile(""); }
NI void guarded_fn(void) {
    if (guard_flag[7]) guard_fn[7](7);
    __asm__ volatile("");
}

/* Eight plain frames above the measured call, each returning after the one
 * below: a probe that upsets the return-stack predictor (a sled exit that
 * returned by `ret` through the substituted slot did) makes every one of
 * these returns mispredict, which a call straight from the loop hides. */
NI static void deep0(void (*f)(void)) { f(); __asm__ volatile(""); }
#define DEEP(n, m) NI static void n(void (*f)(void)) { m(f); __asm__ volatile(""); }
DEEP(deep1, deep0) DEEP(deep2, deep1) DEEP(deep3, deep2) DEEP(deep4, deep3)
DEEP(deep5, deep4) DEEP(deep6, deep5) DEEP(deep7, deep6)

/* Ticks per call of `f`, from the loop itself or (`deep`) from under the
 * eight frames of `deep7`. */
NI static void loop_cost_at(const char *name, void (*f)(void), int deep, int reps) {
    double *v = malloc(reps * sizeof *v);
    for (int r = 0; r < reps; r++) {
        uint64_t t0 = now();
        if (deep)
            for (int i = 0; i < BATCH; i++) deep7(f);
        else
            for (int i = 0; i < BATCH; i++) f();
        v[r] = (double)(now() - t0) / BATCH;
    }
    printf("{\"sec\":\"invoke\",\"case\":\"%s\"", name);
    print_samples("ticks", v, reps);
    printf("}\n");
    free(v);
}

NI static void table2(int reps) {
    discover();
    double *off = malloc(reps * sizeof *off), *on = malloc(reps * sizeof *on);
    /* The static guard's activation: two data stores per probe. */
    int n = n_probes < (1 << 16) ? n_probes : (1 << 16);
    for (int r = 0; r < reps; r++) {
        uint64_t t0 = now();
        for (int i = 0; i < n; i++) guard_flag[i] = 0;
        uint64_t t1 = now();
        for (int i = 0; i < n; i++) guard_fn[i] = empty_handler, guard_flag[i] = 1;
        uint64_t t2 = now();
        off[r] = (double)(t1 - t0) / n;
        on[r] = (double)(t2 - t1) / n;
    }
    printf("{\"sec\":\"toggle\",\"provider\":\"static-guard\",\"strategy\":\"guard\",\"class\":\"all\",\"n\":%d", n);
    print_samples("deactivate", off, reps);
    print_samples("activate", on, reps);
    printf("}\n");
    for (int s = 0; s < 4; s++) {
        check(fastinst_set_strategy(strategies[s]), "set_strategy");
        for (int sled = 0; sled < 2; sled++)
            for (int st = 0; st < 2; st++) {
                int cnt = 0;
                for (int i = 0; i < n_probes; i++) cnt += probes[i].sled == sled && probes[i].straddles == st;
                if (!cnt) continue;
                for (int r = 0; r < reps; r++) {
                    uint64_t t0 = now();
                    for (int i = 0; i < n_probes; i++)
                        if (probes[i].sled == sled && probes[i].straddles == st) check(fastinst_deactivate(probes[i].id), "deactivate");
                    uint64_t t1 = now();
                    for (int i = 0; i < n_probes; i++)
                        if (probes[i].sled == sled && probes[i].straddles == st)
                            check(fastinst_activate(probes[i].id, empty_handler), "activate");
                    uint64_t t2 = now();
                    off[r] = (double)(t1 - t0) / cnt;
                    on[r] = (double)(t2 - t1) / cnt;
                }
                printf("{\"sec\":\"toggle\",\"provider\":\"%s\",\"strategy\":\"%s\",\"class\":\"%s\",\"n\":%d",
                       sled ? "sled" : "finstrument", strategies[s], st ? "straddlers" : "non-straddlers", cnt);
                print_samples("deactivate", off, reps);
                print_samples("activate", on, reps);
                printf("}\n");
            }
    }
    /* Leave the field off: its handlers never run again anyway. */
    for (int i = 0; i < n_probes; i++) check(fastinst_deactivate(probes[i].id), "deactivate");

    printf("{\"sec\":\"hot\",\"finstrument_split\":%d,\"sled_split\":%d}\n", hot_split, sled_split);
    loop_cost_at("plain call", plain_fn, 0, reps);
    guard_flag[7] = 0;
    guard_fn[7] = empty_handler;
    loop_cost_at("static guard, off", guarded_fn, 0, reps);
    guard_flag[7] = 1;
    loop_cost_at("static guard, on (empty handler)", guarded_fn, 0, reps);
    for (int s = 0; s < 4; s++) {
        char name[96];
        check(fastinst_set_strategy(strategies[s]), "set_strategy");
        check(fastinst_deactivate(hot_entry), "deactivate");
        check(fastinst_deactivate(hot_exit), "deactivate");
        check(fastinst_deactivate(sled_entry), "deactivate");
        check(fastinst_deactivate(sled_exit), "deactivate");
        snprintf(name, sizeof name, "finstrument, off (%s)", strategies[s]);
        loop_cost_at(name, hot, 0, reps);
        snprintf(name, sizeof name, "sled, off (%s)", strategies[s]);
        loop_cost_at(name, sled_hot, 0, reps);
    }
    check(fastinst_set_strategy("flip"), "set_strategy");
    check(fastinst_activate(hot_entry, empty_handler), "activate");
    loop_cost_at("finstrument, entry on (empty handler)", hot, 0, reps);
    check(fastinst_activate(hot_exit, empty_handler), "activate");
    loop_cost_at("finstrument, entry and exit on", hot, 0, reps);
    check(fastinst_activate(sled_entry, empty_handler), "activate");
    loop_cost_at("sled, entry on (empty handler)", sled_hot, 0, reps);
    check(fastinst_activate(sled_exit, empty_handler), "activate");
    loop_cost_at("sled, entry and exit on", sled_hot, 0, reps);
    loop_cost_at("finstrument, entry and exit on, 8 frames deep", hot, 1, reps);
    loop_cost_at("sled, entry and exit on, 8 frames deep", sled_hot, 1, reps);
    check(fastinst_deactivate(hot_entry), "deactivate");
    check(fastinst_deactivate(hot_exit), "deactivate");
    check(fastinst_deactivate(sled_entry), "deactivate");
    check(fastinst_deactivate(sled_exit), "deactivate");
    loop_cost_at("plain call, 8 frames deep", plain_fn, 1, reps);
    loop_cost_at("sled, off, 8 frames deep", sled_hot, 1, reps);
    free(off);
    free(on);
}

/* ---- Fig. 10 ---- */

#define F10_BATCH 10

NI static void fig10(int want) {
    discover();
    int nstr = 0, nnon = 0;
    for (int i = 0; i < n_probes; i++)
        if (!probes[i].sled) probes[i].straddles ? nstr++ : nnon++;
    /* About 10% straddlers: all the field has, up to a tenth of `want`. */
    int take_str = nstr < want / 10 ? nstr : want / 10;
    int take_non = want - take_str < nnon ? want - take_str : nnon;
    fastinst_probe_id *sel[2];
    int cnt[2] = {0, 0};
    sel[0] = malloc(take_non * sizeof **sel);
    sel[1] = malloc(take_str * sizeof **sel);
    for (int i = 0; i < n_probes; i++) {
        if (probes[i].sled) continue;
        int st = probes[i].straddles, lim = st ? take_str : take_non;
        if (cnt[st] < lim) sel[st][cnt[st]++] = probes[i].id;
    }
    printf("{\"sec\":\"fig10-set\",\"non_straddlers\":%d,\"straddlers\":%d,\"batch\":%d}\n", cnt[0], cnt[1], F10_BATCH);
    for (int s = 0; s < 4; s++) {
        check(fastinst_set_strategy(strategies[s]), "set_strategy");
        /* One untimed round first: the first write to a code page pays for
         * making it writable (mprotect), once per page and process, and a
         * strategy's first use sets up its trampolines. */
        for (int op = 0; op < 2; op++)
            for (int st = 0; st < 2; st++)
                for (int k = 0; k < cnt[st]; k++)
                    check(op ? fastinst_activate(sel[st][k], empty_handler) : fastinst_deactivate(sel[st][k]), "toggle");
        for (int op = 0; op < 2; op++)
            for (int st = 0; st < 2; st++) {
                int nb = cnt[st] / F10_BATCH;
                double *v = malloc((nb ? nb : 1) * sizeof *v);
                for (int b = 0; b < nb; b++) {
                    fastinst_probe_id *p = sel[st] + b * F10_BATCH;
                    uint64_t t0 = now();
                    for (int k = 0; k < F10_BATCH; k++)
                        check(op ? fastinst_activate(p[k], empty_handler) : fastinst_deactivate(p[k]), "toggle");
                    v[b] = (double)(now() - t0) / F10_BATCH;
                }
                printf("{\"sec\":\"fig10\",\"strategy\":\"%s\",\"op\":\"%s\",\"class\":\"%s\"", strategies[s],
                       op ? "activate" : "deactivate", st ? "straddlers" : "non-straddlers");
                print_samples("ticks", v, nb);
                printf("}\n");
                free(v);
            }
    }
}

/* ---- Fig. 11-13 ---- */

static atomic_int stop_flag, go_flag;
static atomic_ullong total_calls, total_a, total_b;
static __thread uint64_t calls_a, calls_b;

NI static void handler_a(fastinst_probe_id id) {
    (void)id;
    calls_a++;
}
NI static void handler_b(fastinst_probe_id id) {
    (void)id;
    calls_b++;
}

NI static void *executor(void *arg) {
    (void)arg;
    uint64_t n = 0;
    while (!atomic_load_explicit(&go_flag, memory_order_acquire)) _mm_pause();
    while (!atomic_load_explicit(&stop_flag, memory_order_relaxed)) {
        for (int i = 0; i < 64; i++) hot();
        n += 64;
    }
    atomic_fetch_add(&total_calls, n);
    atomic_fetch_add(&total_a, calls_a);
    atomic_fetch_add(&total_b, calls_b);
    return NULL;
}

static double tsc_hz;
static int mode_aa;
static uint64_t toggles, late;

NI static void *toggler(void *arg) {
    uint64_t period = *(uint64_t *)arg, next = now();
    int state = 0;
    while (!atomic_load_explicit(&go_flag, memory_order_acquire)) _mm_pause();
    while (!atomic_load_explicit(&stop_flag, memory_order_relaxed)) {
        next += period;
        uint64_t t;
        while ((t = __rdtsc()) < next) _mm_pause();
        if (t > next + period) { /* cannot keep the rate: do not burst */
            next = t;
            late++;
        }
        state ^= 1;
        if (mode_aa) check(fastinst_activate(hot_entry, state ? handler_b : handler_a), "activate");
        else check(state ? fastinst_deactivate(hot_entry) : fastinst_activate(hot_entry, handler_a), "toggle");
        toggles++;
    }
    return NULL;
}

NI static double measure_tsc_hz(void) {
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    uint64_t t0 = now();
    do clock_gettime(CLOCK_MONOTONIC, &b);
    while ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec) < 20e6);
    uint64_t t1 = now();
    return (t1 - t0) / ((b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) * 1e-9);
}

NI static void fig11(const char *strategy, const char *mode, double rate, int threads, int ms) {
    check(fastinst_on_discovery(on_probe, NULL), "on_discovery");
    hot();
    if (hot_entry == UINT32_MAX) {
        fprintf(stderr, "driver: hot's probe was not discovered\n");
        exit(1);
    }
    tsc_hz = measure_tsc_hz();
    check(fastinst_set_strategy(strategy), "set_strategy");
    check(fastinst_deactivate(hot_exit), "deactivate");
    int toggling = strcmp(mode, "aa") == 0 || strcmp(mode, "ad") == 0;
    mode_aa = strcmp(mode, "aa") == 0;
    if (strcmp(mode, "off") == 0) check(fastinst_deactivate(hot_entry), "deactivate");
    else check(fastinst_activate(hot_entry, handler_a), "activate");
    pthread_t t[256], tg;
    uint64_t period = (uint64_t)(tsc_hz / (rate > 0 ? rate : 1));
    if (threads > 256) threads = 256;
    for (int i = 0; i < threads; i++) pthread_create(&t[i], NULL, executor, NULL);
    if (toggling) pthread_create(&tg, NULL, toggler, &period);
    struct timespec a, b, d = {ms / 1000, (ms % 1000) * 1000000L};
    clock_gettime(CLOCK_MONOTONIC, &a);
    atomic_store_explicit(&go_flag, 1, memory_order_release);
    nanosleep(&d, NULL);
    atomic_store(&stop_flag, 1);
    clock_gettime(CLOCK_MONOTONIC, &b);
    for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
    if (toggling) pthread_join(tg, NULL);
    double secs = (b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) * 1e-9;
    printf("{\"sec\":\"fig11\",\"strategy\":\"%s\",\"mode\":\"%s\",\"rate_hz\":%.0f,\"threads\":%d,\"seconds\":%.6f,"
           "\"calls\":%llu,\"a\":%llu,\"b\":%llu,\"toggles\":%llu,\"late\":%llu,\"tsc_hz\":%.0f,\"split\":%d}\n",
           strategy, mode, toggling ? rate : 0.0, threads, secs, (unsigned long long)total_calls,
           (unsigned long long)total_a, (unsigned long long)total_b, (unsigned long long)toggles,
           (unsigned long long)late, tsc_hz, hot_split);
}

int main(int argc, char **argv) {
    if (argc >= 3 && strcmp(argv[1], "table2") == 0) table2(atoi(argv[2]));
    else if (argc >= 3 && strcmp(argv[1], "fig10") == 0) fig10(atoi(argv[2]));
    else if (argc >= 7 && strcmp(argv[1], "fig11") == 0)
        fig11(argv[2], argv[3], atof(argv[4]), atoi(argv[5]), atoi(argv[6]));
    else {
        fprintf(stderr, "usage: driver table2 REPS | fig10 N | fig11 STRATEGY MODE RATE_HZ THREADS MS\n");
        return 2;
    }
    return 0;
}
