/* A site rewritten behind the runtime's back is refused with exactly
 * FASTINST_EPATCH, and nothing is written; once its bytes are back, the
 * probe switches again. Built with -finstrument-functions; run with the
 * flip strategy. Prints "ok ..." on success; exits non-zero otherwise. */
#include "fastinst.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define CHECK(c, ...) do { if (!(c)) { fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
    fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); exit(1); } } while (0)

static long hits;
__attribute__((no_instrument_function)) static void count(fastinst_probe_id id) { (void)id; hits++; }

__attribute__((noinline)) int victim(int x) { return x * 7 + 3; }

__attribute__((no_instrument_function)) static void writable(const void *at) {
    long page = sysconf(_SC_PAGESIZE);
    void *base = (void *)((uintptr_t)at & ~(uintptr_t)(page - 1));
    CHECK(mprotect(base, 2 * page, PROT_READ | PROT_WRITE | PROT_EXEC) == 0, "mprotect");
}

int main(void) {
    CHECK(victim(1) == 10, "victim");
    /* Its entry probe, discovered by that call. */
    fastinst_probe_meta m;
    int found = 0;
    for (fastinst_probe_id id = 0; id < fastinst_probe_count(); id++)
        if (fastinst_probe_info(id, &m) == 0 && strcmp(m.function_name, "victim") == 0 && m.kind == FASTINST_ENTRY &&
            m.site != NULL) {
            found = 1;
            break;
        }
    CHECK(found, "no entry probe of victim");
    CHECK(fastinst_set_strategy("flip") == 0, "flip");
    CHECK(fastinst_deactivate(m.id) == 0, "deactivate");
    /* Two-byte NOPs and a NOP: no form the runtime writes (its paper form
     * is the one 5-byte NOP), and harmless to run. */
    unsigned char off[8], nop[5] = {0x66, 0x90, 0x66, 0x90, 0x90};
    CHECK(m.site_len == 5, "site of %u bytes", m.site_len);
    memcpy(off, m.site, 5);
    CHECK(memcmp(off, nop, 5) != 0, "the off form is the foreign bytes already");
    /* Someone else writes the site. */
    writable(m.site);
    memcpy((void *)m.site, nop, 5);
    int rc = fastinst_activate(m.id, count);
    CHECK(rc == FASTINST_EPATCH, "activate over a foreign write: %d (%s)", rc, fastinst_strerror(rc));
    CHECK(memcmp(m.site, nop, 5) == 0, "the refused activation wrote the site");
    CHECK(fastinst_is_active(m.id) == 0, "refused, yet active");
    CHECK(victim(2) == 17 && hits == 0, "victim ran the hook while refused");
    /* Its bytes back: the probe switches again. */
    memcpy((void *)m.site, off, 5);
    rc = fastinst_activate(m.id, count);
    CHECK(rc == 0, "activate after the bytes came back: %s", fastinst_strerror(rc));
    CHECK(victim(3) == 24 && hits == 1, "hits %ld", hits);
    CHECK(strcmp(fastinst_strerror(FASTINST_EPATCH), "patching the code failed") == 0, "strerror");
    printf("ok EPATCH refused a foreign write\n");
    return 0;
}
