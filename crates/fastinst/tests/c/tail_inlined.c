/* A function whose own body leaves through a tail jump to the exit hook
 * (keyed by the function, since that hook call returns into the caller)
 * and whose copies inlined elsewhere leave through `call`s. Every probe is
 * switched off as it is discovered; then no hook call may reach a probe
 * that is off more than once per probe (the call during which it was
 * discovered). Before the fix, the inlined copies' exits were never
 * discovered and called the hook on every call. Prints "ok probes=P
 * inactive=H calls=C"; exits non-zero on a failure. */
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

static fastinst_probe_id ids[1024];
static int n, relv_tail_exits, relv_call_exits;
static void off(const fastinst_probe_meta *m, void *u) {
    (void)u;
    if (n < 1024) ids[n++] = m->id;
    if (m->kind == FASTINST_EXIT && strcmp(m->function_name, "relv") == 0) {
        if (m->form == FASTINST_FORM_TAIL || m->form == FASTINST_FORM_TAIL_PLT || m->form == FASTINST_FORM_TAIL_GOT)
            relv_tail_exits++;
        else
            relv_call_exits++;
    }
    if (fastinst_deactivate(m->id) != 0) {
        fprintf(stderr, "FAIL: deactivate %u\n", m->id);
        exit(1);
    }
}

int main(int argc, char **argv) {
    long calls = argc > 1 ? atol(argv[1]) : 100000;
    if (fastinst_on_discovery(off, NULL) != 0) return 1;
    for (long i = 0; i < calls; i++) {
        fp((int)i);
        twice((int)i);
    }
    if (relv_tail_exits < 1 || relv_call_exits < 1) {
        /* The compiler did not lay the program out as the test needs. */
        fprintf(stderr, "FAIL: relv has %d tail-jump and %d call exits\n", relv_tail_exits, relv_call_exits);
        return 3;
    }
    long hits = 0;
    for (int i = 0; i < n; i++) hits += fastinst_inactive_hits(ids[i]);
    printf("ok probes=%d inactive=%ld calls=%ld\n", n, hits, calls * 3);
    if (hits > n) {
        fprintf(stderr, "FAIL: %ld hook calls reached switched-off probes\n", hits);
        return 2;
    }
    return 0;
}
