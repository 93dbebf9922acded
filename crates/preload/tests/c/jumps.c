/* Control flow that leaves instrumented calls without their exit hooks, and
 * hooks reached from a signal handler, for the profiler's pairing tests:
 * - catcher() calls thrower(), which recurses and longjmp()s back to
 *   catcher: the exit hooks of every thrower activation never run;
 * - a 2 kHz interval timer delivers SIGALRM, whose handler on_signal()
 *   calls in_handler(): instrumented calls on top of whatever instrumented
 *   call (or hook) the signal interrupted;
 * - after() runs at a steady rate and always returns normally: its call
 *   count and duration are known.
 * stdout is deterministic (the expected counts); stderr has the signals. */
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#define ROUNDS 20000

static jmp_buf env;
static volatile long sink;
static volatile sig_atomic_t handled;

static long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000L + t.tv_nsec;
}

__attribute__((noinline)) void spin_us(int us) {
    long end = now_ns() + us * 1000L;
    while (now_ns() < end) sink++;
}

__attribute__((noinline)) void thrower(int depth) {
    sink++;
    if (depth == 0) longjmp(env, 1);
    thrower(depth - 1);
    sink++;
}

__attribute__((noinline)) void catcher(int depth) {
    if (setjmp(env) == 0) thrower(depth);
}

__attribute__((noinline)) void after(void) { spin_us(20); }

__attribute__((noinline)) void in_handler(void) { sink++; }

__attribute__((noinline)) void on_signal(int sig) {
    (void)sig;
    in_handler();
    handled++;
}

int main(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval it = {{0, 500}, {0, 500}};
    setitimer(ITIMER_REAL, &it, NULL);
    for (int r = 0; r < ROUNDS; r++) {
        catcher(r % 8);
        after();
    }
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    printf("expect after calls %d\n", ROUNDS);
    printf("expect catcher calls %d\n", ROUNDS);
    fprintf(stderr, "signals %d\n", (int)handled);
    return 0;
}
