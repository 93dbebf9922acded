/* The fastinst API benchmark: invocation and toggle costs in TSC ticks,
 * median and p90 over batches, beside baselines measured in the same run.
 * Built and run by `cargo bench -p fastinst-cli --bench api`. */
#include "fastinst.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <x86intrin.h>

void empty_probe(void);
extern void (*const all_fns[])(void);
extern const int n_fns;

#define REPS 301
#define BATCH 1000

__attribute__((noinline, no_instrument_function)) void plain_fn(void) { __asm__ volatile(""); }
__attribute__((no_instrument_function)) static void empty_handler(fastinst_probe_id id) { (void)id; }
static volatile int guard_flag[1];
static void (*guard_fn[1])(fastinst_probe_id);
__attribute__((noinline, no_instrument_function)) void guarded_fn(void) {
    if (guard_flag[0]) guard_fn[0](0);
    __asm__ volatile("");
}

__attribute__((no_instrument_function)) static uint64_t now(void) {
    unsigned aux;
    _mm_lfence();
    uint64_t t = __rdtscp(&aux);
    _mm_lfence();
    return t;
}

__attribute__((no_instrument_function)) static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

__attribute__((no_instrument_function)) static void report(const char *name, double *v, int n, double base) {
    qsort(v, n, sizeof *v, cmp);
    double med = v[n / 2], p90 = v[n * 9 / 10];
    if (base > 0)
        printf("| %-58s | %8.1f | %8.1f | %6.2fx |\n", name, med, p90, med / base);
    else
        printf("| %-58s | %8.1f | %8.1f |        |\n", name, med, p90);
}

__attribute__((no_instrument_function)) static double loop_cost(void (*f)(void), double *out) {
    for (int r = 0; r < REPS; r++) {
        uint64_t t0 = now();
        for (int i = 0; i < BATCH; i++) f();
        out[r] = (double)(now() - t0) / BATCH;
    }
    double tmp[REPS];
    memcpy(tmp, out, sizeof tmp);
    qsort(tmp, REPS, sizeof *tmp, cmp);
    return tmp[REPS / 2];
}

static fastinst_probe_id probe_of[4096][2];
static int straddles[4096][2];
static int have[4096][2];

__attribute__((no_instrument_function)) static void on_probe(const fastinst_probe_meta *m, void *u) {
    (void)u;
    for (int i = 0; i < n_fns; i++)
        if (m->function == (const void *)all_fns[i]) {
            probe_of[i][m->kind] = m->id;
            straddles[i][m->kind] = m->split != 0;
            have[i][m->kind] = 1;
        }
    if (m->function == (const void *)empty_probe) {
        probe_of[4095][m->kind] = m->id;
        have[4095][m->kind] = 1;
    }
}

int main(int argc, char **argv) {
    (void)argc;
    (void)argv;
    double v[REPS];
    fastinst_on_discovery(on_probe, NULL);
    empty_probe();
    for (int i = 0; i < n_fns; i++) all_fns[i]();
    fastinst_probe_id en = probe_of[4095][0], ex = probe_of[4095][1];
    fastinst_probe_meta me;
    fastinst_probe_info(en, &me);
    printf("## invocation (ticks per call; entry probe %s)\n\n", me.arg_rewritten ? "passes its id (rewritten load)" : "found by return-address lookup");
    printf("| case | median | p90 | vs plain call |\n| --- | --- | --- | --- |\n");
    double base = loop_cost(plain_fn, v);
    report("plain call, uninstrumented", v, REPS, base);
    guard_fn[0] = empty_handler;
    guard_flag[0] = 0;
    loop_cost(guarded_fn, v);
    report("static guard `if (flag[id]) fn[id](id)`, off", v, REPS, base);
    guard_flag[0] = 1;
    loop_cost(guarded_fn, v);
    report("static guard, on, empty handler", v, REPS, base);
    const char *strategies[] = {"flip", "paper", "word-sync"};
    for (int s = 0; s < 3; s++) {
        fastinst_set_strategy(strategies[s]);
        fastinst_deactivate(en);
        fastinst_deactivate(ex);
        loop_cost(empty_probe, v);
        char name[96];
        snprintf(name, sizeof name, "instrumented fn, both probes off (%s)", strategies[s]);
        report(name, v, REPS, base);
    }
    fastinst_set_strategy("flip");
    fastinst_activate(en, empty_handler);
    loop_cost(empty_probe, v);
    report("instrumented fn, entry probe on (empty handler), exit off", v, REPS, base);
    fastinst_activate(ex, empty_handler);
    loop_cost(empty_probe, v);
    report("instrumented fn, both probes on (empty handler)", v, REPS, base);
    fastinst_deactivate(en);
    fastinst_deactivate(ex);

    printf("\n## activate / deactivate through the API (ticks per probe, pass over %d idle probes)\n\n", 2 * n_fns);
    printf("| strategy | probes | deactivate median | p90 | activate median | p90 |\n| --- | --- | --- | --- | --- | --- |\n");
    int total = 0, nstr = 0;
    for (int i = 0; i < n_fns; i++)
        for (int k = 0; k < 2; k++)
            if (have[i][k]) {
                total++;
                nstr += straddles[i][k];
            }
    const char *all[] = {"flip", "paper", "word-sync", "word-async"};
    for (int s = 0; s < 4; s++) {
        fastinst_set_strategy(all[s]);
        for (int st = 0; st < 2; st++) {
            int reps = (s >= 2 && st == 1) ? 5 : 31;
            double off[64], on[64];
            for (int r = 0; r < reps; r++) {
                int n = 0;
                uint64_t t0 = now();
                for (int i = 0; i < n_fns; i++)
                    for (int k = 0; k < 2; k++)
                        if (have[i][k] && straddles[i][k] == st) {
                            fastinst_deactivate(probe_of[i][k]);
                            n++;
                        }
                uint64_t t1 = now();
                for (int i = 0; i < n_fns; i++)
                    for (int k = 0; k < 2; k++)
                        if (have[i][k] && straddles[i][k] == st) fastinst_activate(probe_of[i][k], empty_handler);
                uint64_t t2 = now();
                off[r] = n ? (double)(t1 - t0) / n : 0;
                on[r] = n ? (double)(t2 - t1) / n : 0;
            }
            qsort(off, reps, sizeof *off, cmp);
            qsort(on, reps, sizeof *on, cmp);
            printf("| %s | %s (%d) | %.1f | %.1f | %.1f | %.1f |\n", all[s], st ? "straddlers" : "non-straddlers",
                   st ? nstr : total - nstr, off[reps / 2], off[reps * 9 / 10], on[reps / 2], on[reps * 9 / 10]);
        }
    }
    fastinst_stats stt = {.size = sizeof stt};
    fastinst_get_stats(&stt);
    printf("\ndiscovery: %llu probes, %llu ticks per probe\n", (unsigned long long)stt.probes,
           (unsigned long long)(stt.discovery_ticks / (stt.discoveries ? stt.discoveries : 1)));
    return 0;
}
