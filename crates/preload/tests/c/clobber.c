/* A FASTINST_CLIENT that switches every probe on with a handler that
 * clobbers every register a C function may clobber: the integer scratch
 * registers, all vector registers at full width, the flags. Anything the
 * trampolines fail to preserve shows in the program's output. Prints
 * "clobber: P probes, E entries, X exits" to stderr at exit. */
#include "fastinst.h"
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

static _Atomic unsigned long probes, entries, exits;
static int wide; /* 0 sse, 1 avx, 2 avx-512 */

static void clobber(void) {
    __asm__ volatile(
        "mov $0x5a5a5a5a5a5a5a5a, %%rax\n\t"
        "mov %%rax, %%rcx\n\tmov %%rax, %%rdx\n\tmov %%rax, %%rsi\n\tmov %%rax, %%rdi\n\t"
        "mov %%rax, %%r8\n\tmov %%rax, %%r9\n\tmov %%rax, %%r10\n\tmov %%rax, %%r11\n\t"
        "pcmpeqd %%xmm0, %%xmm0\n\tpcmpeqd %%xmm1, %%xmm1\n\tpcmpeqd %%xmm2, %%xmm2\n\tpcmpeqd %%xmm3, %%xmm3\n\t"
        "pcmpeqd %%xmm4, %%xmm4\n\tpcmpeqd %%xmm5, %%xmm5\n\tpcmpeqd %%xmm6, %%xmm6\n\tpcmpeqd %%xmm7, %%xmm7\n\t"
        "cmp %%rax, %%rcx\n\t"
        ::: "rax", "rcx", "rdx", "rsi", "rdi", "r8", "r9", "r10", "r11",
        "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "cc");
    if (wide >= 1)
        __asm__ volatile(
            "vpcmpeqd %%ymm0, %%ymm0, %%ymm0\n\tvpcmpeqd %%ymm1, %%ymm1, %%ymm1\n\t"
            "vpcmpeqd %%ymm2, %%ymm2, %%ymm2\n\tvpcmpeqd %%ymm7, %%ymm7, %%ymm7\n\t"
            ::: "xmm0", "xmm1", "xmm2", "xmm7");
    if (wide >= 2)
        __asm__ volatile(
            "vpternlogd $0xff, %%zmm0, %%zmm0, %%zmm0\n\tvpternlogd $0xff, %%zmm1, %%zmm1, %%zmm1\n\t"
            "vpternlogd $0xff, %%zmm5, %%zmm5, %%zmm5\n\t"
            ::: "xmm0", "xmm1", "xmm5");
}

static void on_entry(fastinst_probe_id id) { (void)id; entries++; clobber(); }
static void on_exit_probe(fastinst_probe_id id) { (void)id; exits++; clobber(); }

static void on_probe(const fastinst_probe_meta *m, void *u) {
    (void)u;
    probes++;
    int rc = fastinst_activate(m->id, m->kind == FASTINST_ENTRY ? on_entry : on_exit_probe);
    if (rc != 0) { fprintf(stderr, "clobber: activate %u: %s\n", m->id, fastinst_strerror(rc)); abort(); }
}

static void report(void) {
    fprintf(stderr, "clobber: %lu probes, %lu entries, %lu exits\n", (unsigned long)probes,
            (unsigned long)entries, (unsigned long)exits);
}

int fastinst_client_init(void) {
    __builtin_cpu_init();
    wide = __builtin_cpu_supports("avx512f") ? 2 : __builtin_cpu_supports("avx") ? 1 : 0;
    atexit(report);
    return fastinst_on_discovery(on_probe, NULL);
}
