/* A probe of a library that dlclose unloaded answers FASTINST_EUNLOADED,
 * through every call that would touch its code, and exactly that code.
 * argv[1]: an instrumented library nothing else links (dlclose really
 * unloads it). Prints "ok ..." on success; exits non-zero otherwise. */
#include "fastinst.h"
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(c, ...) do { if (!(c)) { fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
    fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); exit(1); } } while (0)

static void count(fastinst_probe_id id) { (void)id; }

int main(int argc, char **argv) {
    CHECK(argc > 1, "usage: unloaded LIBRARY");
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    CHECK(h, "dlopen: %s", dlerror());
    int (*entry)(int) = (int (*)(int))dlsym(h, "lib_entry");
    CHECK(entry, "dlsym: %s", dlerror());
    CHECK(entry(10) > 0, "lib_entry");
    /* The library's probes, found by name while it is loaded. */
    fastinst_probe_id ids[64];
    int n = 0;
    uint32_t total = fastinst_probe_count();
    for (fastinst_probe_id id = 0; id < total && n < 64; id++) {
        fastinst_probe_meta m;
        if (fastinst_probe_info(id, &m) != 0) continue;
        if (strcmp(m.function_name, "lib_leaf") == 0 || strcmp(m.function_name, "lib_entry") == 0) ids[n++] = id;
    }
    CHECK(n >= 2, "%d probes of the library found among %u", n, total);
    for (int i = 0; i < n; i++) {
        int rc = fastinst_activate(ids[i], count);
        CHECK(rc == 0, "activate %u while loaded: %s", ids[i], fastinst_strerror(rc));
        rc = fastinst_deactivate(ids[i]);
        CHECK(rc == 0, "deactivate %u while loaded: %s", ids[i], fastinst_strerror(rc));
    }
    CHECK(dlclose(h) == 0, "dlclose: %s", dlerror());
    for (int i = 0; i < n; i++) {
        int rc = fastinst_activate(ids[i], count);
        CHECK(rc == FASTINST_EUNLOADED, "activate %u after dlclose: %d (%s)", ids[i], rc, fastinst_strerror(rc));
        rc = fastinst_deactivate(ids[i]);
        CHECK(rc == FASTINST_EUNLOADED, "deactivate %u after dlclose: %d (%s)", ids[i], rc, fastinst_strerror(rc));
        CHECK(strcmp(fastinst_strerror(FASTINST_EUNLOADED), "the probe's library has been unloaded") == 0, "strerror");
    }
    printf("ok %d probes unloaded\n", n);
    return 0;
}
