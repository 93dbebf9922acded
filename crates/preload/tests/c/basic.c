/* A call tree with the shapes compilers instrument differently: leaf
 * functions, recursion, function pointers, static helpers, void functions
 * whose exit hook becomes a tail jump at -O2. Prints a deterministic trace. */
#include <stdio.h>

int counter;
static int table[64];

__attribute__((noinline)) void bump(void) { counter++; }
__attribute__((noinline)) void bump_by(int x) { if (x > 0) counter += x; else counter--; }
__attribute__((noinline)) static int square(int x) { return x * x; }
__attribute__((noinline)) int fib(int n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }
__attribute__((noinline)) int apply(int (*f)(int), int x) { return f(x) + 1; }
__attribute__((noinline)) void fill(int seed) {
    for (int i = 0; i < 64; i++) table[i] = square(i + seed) % 97;
}
static inline int inlined_helper(int x) { return x * 7 + 3; }
__attribute__((noinline)) long sum_table(void) {
    long s = 0;
    for (int i = 0; i < 64; i++) s += inlined_helper(table[i]);
    return s;
}

int main(void) {
    long acc = 0;
    for (int round = 0; round < 200; round++) {
        bump();
        bump_by(round % 3 - 1);
        fill(round);
        acc += sum_table();
        acc += apply(square, round) + apply(fib, round % 12);
    }
    printf("counter=%d acc=%ld fib20=%d\n", counter, acc, fib(20));
    return 0;
}
