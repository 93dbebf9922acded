/* Calls lib_entry from a linked library, then dlopens it again by path
 * (argv[1]) -- or a copy, so the dlopen'd one is a distinct module that
 * dlclose really unloads -- calls it, closes it, and does it again. The
 * process's thread count before the first dlopen and after the last goes
 * to stderr. */
#include "task_count.h"
#include <dlfcn.h>
#include <unistd.h>
#include <stdio.h>

int lib_entry(int n);

__attribute__((noinline)) int local(int x) { return x + 1; }

int main(int argc, char **argv) {
    int s = lib_entry(100) + local(1);
    printf("linked: %d\n", s);
    fprintf(stderr, "threads before dlopen: %d\n", task_count());
    for (int round = 0; round < 3 && argc > 1; round++) {
        void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
        if (!h) { printf("dlopen failed: %s\n", dlerror()); return 1; }
        int (*f)(int) = (int (*)(int))dlsym(h, "lib_entry");
        usleep(50000); /* sled libraries are registered within ~10 ms */
        printf("dlopen round %d: %d\n", round, f(50 + round));
        dlclose(h);
    }
    fprintf(stderr, "threads after dlopen: %d\n", task_count());
    printf("after: %d\n", lib_entry(10) + local(2));
    return 0;
}
