/* Parent and child both keep running instrumented code after fork. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

__attribute__((noinline)) long work(int n) {
    long s = 0;
    for (int i = 0; i < n; i++) s += i % 7;
    return s;
}
__attribute__((noinline)) long layer(int n) { return work(n) + work(n / 2); }

int main(void) {
    long before = layer(1000);
    fflush(stdout);
    pid_t p = fork();
    if (p == 0) {
        printf("child: %ld\n", layer(3000) + before);
        fflush(stdout);
        exit(0); /* not _exit: reports are written by atexit handlers */
    }
    int st = 0;
    waitpid(p, &st, 0);
    printf("parent: %ld child-status=%d\n", layer(2000) + before, WEXITSTATUS(st));
    return 0;
}
