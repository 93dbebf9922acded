/* The bundled example: a small multi-threaded "request server" with a call
 * tree worth looking at. Built with -finstrument-functions by the demo. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

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
__attribute__((noinline)) static unsigned lookup(const char *path) { return hash(path) % 1021; }
__attribute__((noinline)) static unsigned render(unsigned key, int depth) {
    return depth == 0 ? key : render(key * 31 + (unsigned)depth, depth - 1) ^ key;
}
__attribute__((noinline)) static unsigned handle(const char *req) {
    char path[64];
    if (parse(req, path)) return 0;
    return render(lookup(path), 6);
}
static void *worker(void *arg) {
    unsigned *acc = arg;
    static const char *reqs[] = {"GET /index.html", "GET /api/users", "POST /api/login", "GET /static/app.js"};
    for (int i = 0; i < 50000; i++) *acc += handle(reqs[i % 4]);
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
