/* A hot function laid out right after one that is never called: a CPU
 * sample that lands on the hot one's first instruction is the hot one's,
 * not its neighbour's. Prints the result of argv[1] calls (default 10^8). */
#include <stdio.h>
#include <stdlib.h>

__attribute__((noinline)) unsigned never(unsigned x) { return x * 3u + 1u; }
__attribute__((noinline)) unsigned hot(unsigned x) { return x * 2654435761u + 1u; }

int main(int argc, char **argv) {
    unsigned long n = argc > 1 ? strtoul(argv[1], 0, 10) : 100000000ul;
    /* Called through a pointer that the compiler cannot see through: the
     * loop calls `hot`, and `never` is kept where it was laid out. */
    unsigned (*volatile f)(unsigned) = argc > 9 ? never : hot;
    unsigned x = (unsigned)argc;
    for (unsigned long i = 0; i < n; i++) x = f(x);
    printf("%u\n", x);
    return 0;
}
