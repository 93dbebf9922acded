/* Function entries and exits that pass and return full 256-bit vectors
 * (built with -mavx2): every argument register ymm0-7 carries upper
 * halves that must survive a probe's handler, and so do a __m256d result
 * and one whose upper half is all zero (the trampolines clean the upper
 * state for their handlers and must give back exactly what was there).
 * Deterministic output. */
#include <immintrin.h>
#include <stdio.h>

__attribute__((noinline)) __m256d mix8(__m256d a, __m256d b, __m256d c, __m256d d, __m256d e, __m256d f,
                                       __m256d g, __m256d h) {
    __m256d two = _mm256_set1_pd(2.0);
    return a + two * b + c * d - e + f * two + g - h;
}

__attribute__((noinline)) __m256d lowonly(double x) {
    /* Upper half zero: a result the exit trampoline must not dirty. */
    return _mm256_castpd128_pd256(_mm_set_pd(x, -x));
}

__attribute__((noinline)) __m256i rot(__m256i v, int k) { return _mm256_add_epi64(v, _mm256_set1_epi64x(k)); }

__attribute__((noinline)) double hsum(__m256d v) {
    double t[4];
    _mm256_storeu_pd(t, v);
    return t[0] + t[1] * 3 + t[2] * 5 + t[3] * 7;
}

__attribute__((noinline)) double scalar(double a, double b) { return a * 1.5 - b; }

int main(void) {
    double acc = 0;
    long long iacc = 0;
    for (int i = 0; i < 20000; i++) {
        double k = i % 97;
        __m256d a = _mm256_set_pd(k, k + 1, k + 2, k + 3);
        __m256d r = mix8(a, a * a, _mm256_set1_pd(0.5), a + 1, a - 2, a * 3, _mm256_set_pd(1, 2, 3, 4),
                         _mm256_set_pd(-1, -2, -3, -4));
        acc += hsum(r) + hsum(lowonly(k)) + scalar(k, acc * 1e-9);
        __m256i v = rot(_mm256_set_epi64x(i, 2 * i, 3 * i, 4 * i), i % 7);
        long long t[4];
        _mm256_storeu_si256((__m256i *)t, v);
        iacc += t[0] - t[1] + 2 * t[2] - t[3];
    }
    printf("avx: %.6f %lld\n", acc, iacc);
    return 0;
}
