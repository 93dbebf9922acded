/* Runs instrumented code (so the runtime patched pages and installed its
 * fault handler), prints, then reads address 0x10: the crash must still
 * kill the process by SIGSEGV, and the runtime's handler, which raises it
 * again, says where it was. */
#include <stdio.h>
__attribute__((noinline)) int f(int x) { return x + 1; }
int main(int argc, char **argv) {
    (void)argv;
    long s = 0;
    for (int i = 0; i < 100000; i++) s += f(i);
    printf("%ld\n", s);
    fflush(stdout);
    volatile int *p = (int *)(long)(argc - 1 + 16);
    return *p;
}
