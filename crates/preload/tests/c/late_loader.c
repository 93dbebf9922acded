/* Runs `host_step` on THREADS threads until the file GO exists, then
 * loads the library PLUGIN (`plugin.c`) and runs its `plugin_work` ROUNDS
 * times on each thread, and prints their checksum: the same however long
 * it waited. With SPIN_MS, each thread first runs the library's work,
 * uncounted, for that long after the load (a watcher that looks every
 * 10 ms finds it while threads run it).
 * usage: late_loader PLUGIN GO THREADS ROUNDS [SPIN_MS] */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

typedef long (*work_fn)(long, long);
static _Atomic(work_fn) work;
static atomic_int spinning = 1;
static long rounds;
static volatile long sink;

__attribute__((noinline)) long host_step(long x) { return x * 31 + 7; }

static void *run(void *arg) {
    long t = (long)arg, s = 0;
    while (!atomic_load(&work)) sink += host_step(t);
    work_fn w = atomic_load(&work);
    while (atomic_load(&spinning)) sink += w(100, t);
    for (long r = 0; r < rounds; r++) s += w(100000, t * 1000 + r);
    return (void *)s;
}

int main(int argc, char **argv) {
    if (argc != 5 && argc != 6) {
        fprintf(stderr, "usage: late_loader PLUGIN GO THREADS ROUNDS [SPIN_MS]\n");
        return 2;
    }
    int threads = atoi(argv[3]);
    rounds = atol(argv[4]);
    long spin_ms = argc == 6 ? atol(argv[5]) : 0;
    atomic_store(&spinning, spin_ms > 0);
    pthread_t t[64];
    for (long i = 0; i < threads && i < 64; i++) pthread_create(&t[i], NULL, run, (void *)i);
    struct timespec nap = {0, 5 * 1000 * 1000};
    while (access(argv[2], F_OK) != 0) nanosleep(&nap, NULL);
    void *h = dlopen(argv[1], RTLD_NOW);
    if (!h) {
        fprintf(stderr, "%s\n", dlerror());
        return 1;
    }
    atomic_store(&work, (work_fn)dlsym(h, "plugin_work"));
    if (spin_ms > 0) {
        struct timespec spin = {spin_ms / 1000, (spin_ms % 1000) * 1000 * 1000};
        nanosleep(&spin, NULL);
        atomic_store(&spinning, 0);
    }
    long sum = 0;
    for (long i = 0; i < threads && i < 64; i++) {
        void *r;
        pthread_join(t[i], &r);
        sum += (long)r;
    }
    printf("plugin checksum %ld\n", sum);
    return 0;
}
