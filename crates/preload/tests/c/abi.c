/* Function entries and exits that depend on every register the ABI lets
 * them: varargs (al = vector-register count), many integer and floating
 * arguments, long double and complex long double returns (x87), struct
 * returns in rax:rdx and in memory, doubles in xmm0:xmm1, a nested
 * function's static chain (r10, gcc only), tail calls, recursion, function
 * pointers, and a signal handler that runs instrumented code.
 * Deterministic output. */
#include <complex.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>

struct pair { long a, b; };
struct big { long v[6]; };
struct dpair { double x, y; };

__attribute__((noinline)) double vsum(int n, ...) {
    va_list ap;
    va_start(ap, n);
    double s = 0;
    for (int i = 0; i < n; i++) {
        if (i % 2) s += va_arg(ap, double);
        else s += va_arg(ap, int);
    }
    va_end(ap);
    return s;
}

__attribute__((noinline)) int vfmt(char *out, size_t len, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int r = vsnprintf(out, len, fmt, ap);
    va_end(ap);
    return r;
}

__attribute__((noinline)) long many(long a, long b, long c, long d, long e, long f, long g, long h, double x0,
                                    double x1, double x2, double x3, double x4, double x5, double x6, double x7,
                                    double x8, double x9) {
    return a + 2 * b + 3 * c + 4 * d + 5 * e + 6 * f + 7 * g + 8 * h +
           (long)(x0 + 2 * x1 + 3 * x2 + 4 * x3 + 5 * x4 + 6 * x5 + 7 * x6 + 8 * x7 + 9 * x8 + 10 * x9);
}

__attribute__((noinline)) long double ldiv3(long double x) { return x / 3.0L; }
__attribute__((noinline)) long double complex lcmul(long double complex a, long double complex b) { return a * b; }
__attribute__((noinline)) struct pair mkpair(long a) { struct pair p = {a, a * a}; return p; }
__attribute__((noinline)) struct big mkbig(long a) { struct big b; for (int i = 0; i < 6; i++) b.v[i] = a + i; return b; }
__attribute__((noinline)) struct dpair mkd(double a) { struct dpair d = {a / 2, a * 2}; return d; }
__attribute__((noinline)) float fmix(float a, float b) { return a * 0.5f + b; }

__attribute__((noinline)) int leaf(int x) { return x * 3 + 1; }
/* At -O2 these become tail calls (jmp), chaining exit probes. */
__attribute__((noinline)) int tail1(int x) { return leaf(x + 1); }
__attribute__((noinline)) int tail2(int x) { return tail1(x * 2); }
__attribute__((noinline)) int rec(int n) { return n <= 0 ? 0 : n + rec(n - 1); }
__attribute__((noinline)) int apply(int (*f)(int), int x) { return f(x) + 1; }

#ifndef __clang__
__attribute__((noinline)) int with_nested(int base) {
    int add(int x) { return x + base; } /* reads base through r10 */
    return apply(add, 5) + apply(add, 7);
}
#else
__attribute__((noinline)) int with_nested(int base) { return 2 * base + 14; }
#endif

static volatile sig_atomic_t signals;
__attribute__((noinline)) void in_handler(void) { signals++; }
static void on_alarm(int s) { (void)s; in_handler(); }

int main(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval it = {{0, 500}, {0, 500}};
    setitimer(ITIMER_REAL, &it, NULL);
    double d = 0;
    long l = 0;
    long double ld = 0;
    long double complex lc = 0;
    char buf[128];
    for (int i = 0; i < 3000; i++) {
        d += vsum(6, i, 0.5 * i, i + 1, 1.25, i + 2, -0.75);
        l += vfmt(buf, sizeof buf, "%d %.3f %s %ld %.2e", i, i / 7.0, "x", (long)i * 3, i * 1e3);
        l += many(i, 1, 2, 3, 4, 5, 6, 7, 0.5, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5, 7.5, 8.5, i);
        ld += ldiv3((long double)i);
        lc += lcmul(i + 1.0L * I, 2.0L - 1.0L * I);
        struct pair p = mkpair(i);
        struct big b = mkbig(i);
        struct dpair q = mkd(i);
        l += p.a + p.b + b.v[0] + b.v[5];
        d += q.x + q.y + fmix((float)i, 0.25f);
        l += tail2(i) + rec(i % 50) + apply(leaf, i) + with_nested(i);
    }
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    printf("d=%.6f l=%ld ld=%.6Lf lc=%.3Lf%+.3Lfi last=%s\n", d, l, ld, creall(lc), cimagl(lc), buf);
    fprintf(stderr, "signals %d\n", (int)signals);
    return 0;
}
