/* XRay's own toggle against fastinst's, on the same clang
 * -fxray-instrument build in one run: __xray_patch_function and
 * __xray_unpatch_function on one function, fastinst_activate and
 * fastinst_deactivate on another's entry probe; then a call of each with
 * its probes on (an empty handler: XRay's entry and exit sleds through its
 * trampolines, fastinst's entry sled and its exit by return-address
 * substitution) beside the same function with its probes off. TSC ticks,
 * median and p90. Linked with XRay's runtime and -lfastinst (whose
 * constructor registers the XRay sleds). */
#include "fastinst.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <x86intrin.h>

/* XRay's runtime interface (xray/xray_interface.h, a C++ header; these
 * are its extern "C" functions). */
enum { XRAY_SUCCESS = 1 };
typedef int XRayEntryType;
int __xray_patch_function(int32_t id);
int __xray_unpatch_function(int32_t id);
uintptr_t __xray_function_address(int32_t id);
size_t __xray_max_function_id(void);
int __xray_set_handler(void (*entry)(int32_t, XRayEntryType));

#define PAIRS 2001
#define CALLS 2000
#define ROUNDS 301

/* Each on a page of its own: XRay's runtime puts the page it patched back
 * to read+execute, and fastinst's next write there would take a fault
 * (resolved by wordpatch's handler, but not a toggle's cost). */
__attribute__((noinline, aligned(4096))) int by_xray(int x) { return x * 3 + 1; }
__attribute__((noinline, aligned(4096))) int by_fastinst(int x) { return x * 3 + 1; }
__attribute__((noinline)) int plain(int x) { return x * 3 + 1; }

static void empty(fastinst_probe_id id) { (void)id; }
static void xray_empty(int32_t id, XRayEntryType t) { (void)id; (void)t; }

static fastinst_probe_id entry_id = UINT32_MAX;
static void on_probe(const fastinst_probe_meta *m, void *u) {
    (void)u;
    if (m->function == (const void *)by_fastinst && m->kind == FASTINST_ENTRY) entry_id = m->id;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
static double q(double *v, int n, double p) {
    qsort(v, n, sizeof *v, cmp);
    return v[(int)(p * (n - 1) + 0.5)];
}

static double ticks(void) {
    unsigned aux;
    return (double)__rdtscp(&aux);
}

/* Ticks per call of f over CALLS calls. */
static double per_call(int (*volatile f)(int)) {
    int acc = 0;
    double t0 = ticks();
    for (int i = 0; i < CALLS; i++) acc += f(i);
    double t1 = ticks();
    __asm__ volatile("" ::"r"(acc));
    return (t1 - t0) / CALLS;
}

int main(void) {
    int32_t xid = 0;
    for (size_t i = 1; i <= __xray_max_function_id(); i++)
        if (__xray_function_address((int32_t)i) == (uintptr_t)by_xray) xid = (int32_t)i;
    if (!xid) { fprintf(stderr, "by_xray has no XRay function id\n"); return 1; }
    if (fastinst_on_discovery(on_probe, NULL) != 0 || entry_id == UINT32_MAX) {
        fprintf(stderr, "by_fastinst has no fastinst probe\n");
        return 1;
    }
    static double xs[PAIRS], fs[PAIRS];
    for (int i = 0; i < PAIRS; i++) {
        double t0 = ticks();
        if (__xray_patch_function(xid) != XRAY_SUCCESS || __xray_unpatch_function(xid) != XRAY_SUCCESS) {
            fprintf(stderr, "XRay patching failed\n");
            return 1;
        }
        double t1 = ticks();
        int a = fastinst_activate(entry_id, empty), d = fastinst_deactivate(entry_id);
        double t2 = ticks();
        if (a != 0 || d != 0) { fprintf(stderr, "fastinst: %s\n", fastinst_strerror(a ? a : d)); return 1; }
        xs[i] = t1 - t0;
        fs[i] = t2 - t1;
    }
    printf("Switching on then off (%d pairs), TSC ticks per pair:\n\n", PAIRS);
    printf("| case | median | p90 |\n|---|---|---|\n");
    double xm = q(xs, PAIRS, 0.5), fm = q(fs, PAIRS, 0.5);
    printf("| XRay __xray_patch_function + __xray_unpatch_function | %.0f | %.0f |\n", xm, q(xs, PAIRS, 0.9));
    printf("| fastinst_activate + fastinst_deactivate (entry probe) | %.0f | %.0f |\n", fm, q(fs, PAIRS, 0.9));
    printf("\nXRay / fastinst, medians: %.1fx\n\n", xm / fm);

    /* Calls with the probes on, beside the same code off. */
    __xray_set_handler(xray_empty);
    if (__xray_patch_function(xid) != XRAY_SUCCESS || fastinst_activate_function((const void *)by_fastinst, empty) < 0) {
        fprintf(stderr, "cannot switch the probes on\n");
        return 1;
    }
    static double p[ROUNDS], x[ROUNDS], f[ROUNDS];
    for (int r = 0; r < ROUNDS; r++) {
        p[r] = per_call(plain);
        x[r] = per_call(by_xray);
        f[r] = per_call(by_fastinst);
    }
    double pm = q(p, ROUNDS, 0.5);
    printf("A call with entry and exit probes on, empty handlers (%d calls a round, %d rounds), TSC ticks per call:\n\n",
           CALLS, ROUNDS);
    printf("| case | median | p90 | over off |\n|---|---|---|---|\n");
    printf("| probes off (baseline) | %.2f | %.2f | +0.00 |\n", pm, q(p, ROUNDS, 0.9));
    double xm2 = q(x, ROUNDS, 0.5), fm2 = q(f, ROUNDS, 0.5);
    printf("| XRay, patched | %.2f | %.2f | %+.2f |\n", xm2, q(x, ROUNDS, 0.9), xm2 - pm);
    printf("| fastinst, on | %.2f | %.2f | %+.2f |\n", fm2, q(f, ROUNDS, 0.9), fm2 - pm);
    __xray_unpatch_function(xid);
    fastinst_deactivate_function((const void *)by_fastinst);
    return 0;
}
