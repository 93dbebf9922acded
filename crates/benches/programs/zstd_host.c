/* The zstd host of the accuracy harness: compresses generated text with
 * libzstd's multi-threaded compressor (ZSTD_c_nbWorkers worker threads, the
 * library's own pool), then decompresses it and checks the round trip.
 * Usage: zstd_host MEGABYTES WORKERS. Prints the sizes and a checksum. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "zstd.h"

static unsigned long long seed = 0x2545f4914f6cdd1dULL;
static unsigned long long next(void) {
    seed ^= seed << 13;
    seed ^= seed >> 7;
    seed ^= seed << 17;
    return seed;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s MEGABYTES WORKERS\n", argv[0]);
        return 2;
    }
    size_t len = (size_t)atoi(argv[1]) << 20;
    int workers = atoi(argv[2]);
    char *text = malloc(len);
    static const char *words[] = {"the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "compress",
                                  "thread", "window", "epoch", "probe", "latency", "sample", "estimate"};
    size_t n = 0;
    while (n < len) {
        const char *w = words[(next() % 16) * (next() % 16) / 16];
        size_t k = strlen(w);
        for (size_t i = 0; i < k && n < len; i++) text[n++] = w[i];
        if (n < len) text[n++] = (next() % 11 == 0) ? '\n' : ' ';
    }
    size_t cap = ZSTD_compressBound(len);
    char *out = malloc(cap);
    ZSTD_CCtx *c = ZSTD_createCCtx();
    ZSTD_CCtx_setParameter(c, ZSTD_c_compressionLevel, 9);
    if (ZSTD_isError(ZSTD_CCtx_setParameter(c, ZSTD_c_nbWorkers, workers))) {
        fprintf(stderr, "no multi-threading in this libzstd\n");
        return 1;
    }
    size_t z = ZSTD_compress2(c, out, cap, text, len);
    if (ZSTD_isError(z)) {
        fprintf(stderr, "compress: %s\n", ZSTD_getErrorName(z));
        return 1;
    }
    char *back = malloc(len);
    size_t d = ZSTD_decompress(back, len, out, z);
    if (ZSTD_isError(d) || d != len || memcmp(back, text, len) != 0) {
        fprintf(stderr, "round trip failed\n");
        return 1;
    }
    unsigned long long h = 1469598103934665603ULL;
    for (size_t i = 0; i < z; i++) h = (h ^ (unsigned char)out[i]) * 1099511628211ULL;
    printf("%zu bytes -> %zu bytes, checksum %016llx\n", len, z, h);
    ZSTD_freeCCtx(c);
    free(text);
    free(out);
    free(back);
    return 0;
}
