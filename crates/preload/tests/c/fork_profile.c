/* A function whose entry probe is off at the fork (5,000 calls in one long
 * epoch: counted whole past its overflow, 64 calls a thread per 10 ms of
 * epoch) is sampled in the child too: the child's profile counts the
 * child's own calls. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

__attribute__((noinline)) long work(int n) {
    long s = 0;
    for (int i = 0; i < n; i++) s += i % 7;
    __asm__ volatile("" : "+r"(s));
    return s;
}

int main(void) {
    long s = 0;
    /* Past work's whole-count overflow: its entry probe is off when the
     * process forks. */
    for (int i = 0; i < 5000; i++) s += work(100);
    fflush(stdout);
    pid_t p = fork();
    if (p == 0) {
        struct timespec ts = {0, 4 * 1000 * 1000};
        for (int i = 0; i < 200; i++) {
            s += work(100);
            nanosleep(&ts, NULL);
        }
        printf("child %d %ld\n", (int)getpid(), s);
        fflush(stdout);
        exit(0); /* not _exit: the reports are written at exit */
    }
    int st = 0;
    waitpid(p, &st, 0);
    printf("parent %ld status %d\n", s, WEXITSTATUS(st));
    return 0;
}
