/* 8 threads running instrumented code; deterministic output. */
#include <pthread.h>
#include <stdio.h>

__attribute__((noinline)) unsigned step(unsigned x) { return x * 1103515245u + 12345u; }
__attribute__((noinline)) unsigned mix(unsigned x, int n) {
    for (int i = 0; i < n; i++) x = step(x) ^ (x >> 7);
    return x;
}
__attribute__((noinline)) void touch(unsigned *p) { *p += 1; }

static void *worker(void *arg) {
    unsigned *r = arg;
    unsigned x = *r;
    for (int i = 0; i < 20000; i++) {
        x = mix(x, 5);
        touch(&x);
    }
    *r = x;
    return NULL;
}

int main(void) {
    pthread_t t[8];
    unsigned r[8];
    for (int i = 0; i < 8; i++) {
        r[i] = (unsigned)i + 1;
        pthread_create(&t[i], NULL, worker, &r[i]);
    }
    for (int i = 0; i < 8; i++) pthread_join(t[i], NULL);
    for (int i = 0; i < 8; i++) printf("thread %d: %u\n", i, r[i]);
    return 0;
}
