/* XRay's runtime and fastinst patching two functions on one code page,
 * turn by turn: XRay puts the page back to read+execute after each of its
 * patches, and fastinst's next toggle there must still work. Linked with
 * XRay's runtime (clang -fxray-instrument) and -lfastinst. Prints "ok
 * fastinst=F xray=X"; exits non-zero on any failure. */
#include "fastinst.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int __xray_patch_function(int32_t id);
int __xray_unpatch_function(int32_t id);
uintptr_t __xray_function_address(int32_t id);
size_t __xray_max_function_id(void);
int __xray_set_handler(void (*entry)(int32_t, int));

#define ROUNDS 1000
#define CHECK(c, ...) do { if (!(c)) { fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); exit(1); } } while (0)

__attribute__((noinline)) int by_xray(int x) { return x + 1; }
__attribute__((noinline)) int by_fastinst(int x) { return x + 2; }

static unsigned long fi_hits, xray_hits;
static void on_fi(fastinst_probe_id id) { (void)id; fi_hits++; }
static void on_xray(int32_t id, int type) { (void)id; if (type == 0) xray_hits++; }

static fastinst_probe_id entry_id = UINT32_MAX;
static void on_probe(const fastinst_probe_meta *m, void *u) {
    (void)u;
    if (m->function == (const void *)by_fastinst && m->kind == FASTINST_ENTRY) entry_id = m->id;
}

int main(void) {
    CHECK((uintptr_t)by_xray / 4096 == (uintptr_t)by_fastinst / 4096, "not on one page");
    int32_t xid = 0;
    for (size_t i = 1; i <= __xray_max_function_id(); i++)
        if (__xray_function_address((int32_t)i) == (uintptr_t)by_xray) xid = (int32_t)i;
    CHECK(xid, "by_xray has no XRay id");
    CHECK(fastinst_on_discovery(on_probe, NULL) == 0 && entry_id != UINT32_MAX, "by_fastinst has no probe");
    __xray_set_handler(on_xray);
    int sum = 0;
    for (int i = 0; i < ROUNDS; i++) {
        CHECK(__xray_patch_function(xid) == 1, "XRay patch %d", i);
        int rc = fastinst_activate(entry_id, on_fi);
        CHECK(rc == 0, "activate %d: %s", i, fastinst_strerror(rc));
        sum += by_fastinst(i) + by_xray(i);
        CHECK(__xray_unpatch_function(xid) == 1, "XRay unpatch %d", i);
        rc = fastinst_deactivate(entry_id);
        CHECK(rc == 0, "deactivate %d: %s", i, fastinst_strerror(rc));
        sum += by_fastinst(i) + by_xray(i);
    }
    CHECK(sum == 2 * ROUNDS * (ROUNDS - 1) + 2 * 3 * ROUNDS, "sum %d", sum);
    CHECK(fi_hits == ROUNDS && xray_hits == ROUNDS, "fastinst %lu, xray %lu", fi_hits, xray_hits);
    printf("ok fastinst=%lu xray=%lu\n", fi_hits, xray_hits);
    return 0;
}
