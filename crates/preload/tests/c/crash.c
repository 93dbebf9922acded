/* Runs instrumented code (so the runtime patched pages and installed its
 * fault handlers), prints, then crashes: by default it reads address 0x10,
 * and must still be killed by SIGSEGV; with argument `ill` it runs `ud2`,
 * and must still be killed by SIGILL. Either way the runtime's handler,
 * which raises the signal again, says where it was. */
#include <stdio.h>
#include <string.h>
__attribute__((noinline)) int f(int x) { return x + 1; }
int main(int argc, char **argv) {
    long s = 0;
    for (int i = 0; i < 100000; i++) s += f(i);
    printf("%ld\n", s);
    fflush(stdout);
    if (argc > 1 && strcmp(argv[1], "ill") == 0) __asm__ volatile("ud2");
    volatile long a = 16;
    return *(volatile int *)a;
}
