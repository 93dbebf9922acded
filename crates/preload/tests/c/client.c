/* A FASTINST_CLIENT: counts entries per probe through the C API and
 * prints the total at exit (to stderr, so the app's stdout is untouched). */
#include "fastinst.h"
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

static _Atomic unsigned long entries, probes;

static void on_entry(fastinst_probe_id id) { (void)id; atomic_fetch_add_explicit(&entries, 1, memory_order_relaxed); }

static void on_probe(const fastinst_probe_meta *m, void *u) {
    (void)u;
    probes++;
    if (m->kind == FASTINST_ENTRY) fastinst_activate(m->id, on_entry);
    else fastinst_deactivate(m->id);
}

static void report(void) { fprintf(stderr, "client: %lu probes, %lu entries\n", (unsigned long)probes, (unsigned long)entries); }

int fastinst_client_init(void) {
    atexit(report);
    return fastinst_on_discovery(on_probe, NULL);
}
