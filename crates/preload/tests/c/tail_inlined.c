/* A function whose own body leaves through a tail jump to the exit hook
 * (keyed by the function, since that hook call returns into the caller)
 * and whose copies inlined elsewhere leave through `call`s.
 *
 * Mode "off" (the default): every probe is switched off as it is
 * discovered; then no hook call may reach a probe that is off more than
 * once per probe (the call during which it was discovered). Before the
 * fix, the inlined copies' exits were never discovered and called the hook
 * on every call. Prints "ok probes=P inactive=H calls=C".
 *
 * Mode "on": every probe stays on with a handler that counts its calls;
 * then `relv`'s tail-jump exit must count exactly the calls of `relv`'s
 * own code (through `fp`), and its inlined copies' exits their own. Before
 * the second fix, the copies' exits ran the tail probe's handler for as
 * long as it stayed on. Prints "ok tail=T copies=K calls=C".
 * Exits non-zero on a failure. */
#include "fastinst.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static volatile int sink;
static void relv(int x) { sink += x * 2; }
static void (*volatile fp)(int) = relv;
__attribute__((noinline)) void twice(int x) {
    relv(x);
    relv(x + 1);
    sink ^= 1;
}

#define MAX_IDS 1024
static fastinst_probe_id ids[MAX_IDS];
static int n, relv_tail_exits, relv_call_exits;
/* Per probe: 1 = relv's tail-jump exit, 2 = an exit of an inlined copy. */
static char role[1 << 16];
static long hits_by_id[1 << 16];
static int mode_on;

static void count(fastinst_probe_id id) {
    if (id < (1u << 16)) hits_by_id[id]++;
}

static void discovered(const fastinst_probe_meta *m, void *u) {
    (void)u;
    if (n < MAX_IDS) ids[n++] = m->id;
    if (m->kind == FASTINST_EXIT && strcmp(m->function_name, "relv") == 0) {
        int tail = m->form == FASTINST_FORM_TAIL || m->form == FASTINST_FORM_TAIL_PLT || m->form == FASTINST_FORM_TAIL_GOT;
        if (tail)
            relv_tail_exits++;
        else
            relv_call_exits++;
        if (m->id < (1u << 16)) role[m->id] = tail ? 1 : 2;
        /* The tail jump is relv's own code; the calls are in `twice`. */
        if (m->inlined != !tail) {
            fprintf(stderr, "FAIL: relv's %s exit has inlined=%u\n", tail ? "tail-jump" : "call", m->inlined);
            exit(5);
        }
    }
    int r = mode_on ? fastinst_activate(m->id, count) : fastinst_deactivate(m->id);
    if (r != 0) {
        fprintf(stderr, "FAIL: switching %u: %d\n", m->id, r);
        exit(1);
    }
}

int main(int argc, char **argv) {
    long calls = argc > 1 ? atol(argv[1]) : 100000;
    mode_on = argc > 2 && strcmp(argv[2], "on") == 0;
    if (fastinst_on_discovery(discovered, NULL) != 0) return 1;
    for (long i = 0; i < calls; i++) {
        fp((int)i);
        twice((int)i);
    }
    if (relv_tail_exits < 1) {
        /* The compiler did not lay the program out as the test needs. */
        fprintf(stderr, "FAIL: relv has no tail-jump exit\n");
        return 3;
    }
    if (mode_on) {
        long tail = 0, copies = 0;
        for (int i = 0; i < n; i++) {
            if (ids[i] >= (1u << 16)) continue;
            if (role[ids[i]] == 1) tail += hits_by_id[ids[i]];
            if (role[ids[i]] == 2) copies += hits_by_id[ids[i]];
        }
        /* A copy's exit taken for the tail site's is never discovered,
         * and runs the tail probe's handler. Each copy's first exit is
         * discovered by its return address and runs its own handler; none
         * may run the tail probe's. */
        if (tail != calls || copies != 2 * calls) {
            fprintf(stderr, "FAIL: relv's tail exit ran %ld times and its copies' exits %ld times for %ld calls each\n",
                    tail, copies, calls);
            return 4;
        }
        printf("ok tail=%ld copies=%ld calls=%ld\n", tail, copies, calls);
        return 0;
    }
    if (relv_call_exits < 1) {
        fprintf(stderr, "FAIL: relv's inlined copies have no exit probes\n");
        return 3;
    }
    long hits = 0;
    for (int i = 0; i < n; i++) {
        long long h = fastinst_inactive_hits(ids[i]);
        if (h < 0) {
            fprintf(stderr, "FAIL: inactive_hits(%u): %s\n", ids[i], fastinst_strerror((int)h));
            return 4;
        }
        hits += h;
    }
    printf("ok probes=%d inactive=%ld calls=%ld\n", n, hits, calls * 3);
    if (hits > n) {
        fprintf(stderr, "FAIL: %ld hook calls reached switched-off probes\n", hits);
        return 2;
    }
    return 0;
}
