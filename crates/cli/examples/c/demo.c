/* The bundled example: a small multi-threaded "request server" with a call
 * tree worth looking at: four workers parse each request, look it up in a
 * cache, fetch from a slow "database" on a miss (a 100 us sleep), render a
 * response recursively and compress it. Built with -finstrument-functions
 * by the demo, which runs it under the latency profiler. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

__attribute__((noinline)) static unsigned hash(const char *s) {
    unsigned h = 2166136261u;
    while (*s) h = (h ^ (unsigned char)*s++) * 16777619u;
    return h;
}
__attribute__((noinline)) static int parse(const char *req, char *path) {
    const char *sp = strchr(req, ' ');
    if (!sp) return -1;
    strncpy(path, sp + 1, 63);
    path[63] = 0;
    return 0;
}
__attribute__((noinline)) static unsigned db_fetch(unsigned key) {
    struct timespec ts = {0, 100000};
    nanosleep(&ts, NULL);
    return key * 2654435761u;
}
__attribute__((noinline)) static unsigned lookup(const char *path, int i) {
    unsigned key = hash(path) % 1021;
    /* One request in 64 misses the cache. */
    return (i % 64 == 0) ? db_fetch(key) : key;
}
__attribute__((noinline)) static unsigned render(unsigned key, int depth) {
    return depth == 0 ? key : render(key * 31 + (unsigned)depth, depth - 1) ^ key;
}
__attribute__((noinline)) static unsigned compress(unsigned seed) {
    unsigned char buf[512];
    unsigned h = 0;
    for (int k = 0; k < 512; k++) buf[k] = (unsigned char)(seed >> (k % 24));
    for (int r = 0; r < 4; r++)
        for (int k = 0; k < 512; k++) h = (h << 5) + h + buf[k];
    return h;
}
__attribute__((noinline)) static unsigned handle(const char *req, int i) {
    char path[64];
    if (parse(req, path)) return 0;
    return compress(render(lookup(path, i), 6));
}
static void *worker(void *arg) {
    unsigned *acc = arg;
    static const char *reqs[] = {"GET /index.html", "GET /api/users", "POST /api/login", "GET /static/app.js"};
    for (int i = 0; i < 50000; i++) *acc += handle(reqs[i % 4], i);
    return NULL;
}
int main(void) {
    pthread_t t[4];
    unsigned acc[4] = {0};
    for (int i = 0; i < 4; i++) pthread_create(&t[i], NULL, worker, &acc[i]);
    for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
    printf("served 200000 requests, checksum %u\n", acc[0] + acc[1] + acc[2] + acc[3]);
    return 0;
}
