/* One thread that keeps values in vector registers xmm0-xmm15 across a
 * long loop and checks them on every pass: an attach that borrows this
 * thread (the only one) for its remote calls must give them back.
 * Prints "intact" or "clobbered". Argument: seconds to run. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

__attribute__((noinline)) int block(long passes) {
    int bad;
    __asm__ volatile(
        "movabs $0x1111111111111111, %%rax\n\tmovq %%rax, %%xmm0\n\t"
        "movabs $0x2222222222222222, %%rax\n\tmovq %%rax, %%xmm1\n\t"
        "movabs $0x3333333333333333, %%rax\n\tmovq %%rax, %%xmm2\n\t"
        "movabs $0x4444444444444444, %%rax\n\tmovq %%rax, %%xmm3\n\t"
        "movabs $0x5555555555555555, %%rax\n\tmovq %%rax, %%xmm4\n\t"
        "movabs $0x6666666666666666, %%rax\n\tmovq %%rax, %%xmm5\n\t"
        "movabs $0x7777777777777777, %%rax\n\tmovq %%rax, %%xmm6\n\t"
        "movabs $0x0123456789abcdef, %%rax\n\tmovq %%rax, %%xmm7\n\t"
        "movabs $0x1010101010101010, %%rax\n\tmovq %%rax, %%xmm8\n\t"
        "movabs $0x2020202020202020, %%rax\n\tmovq %%rax, %%xmm9\n\t"
        "movabs $0x3030303030303030, %%rax\n\tmovq %%rax, %%xmm10\n\t"
        "movabs $0x4040404040404040, %%rax\n\tmovq %%rax, %%xmm11\n\t"
        "movabs $0x5050505050505050, %%rax\n\tmovq %%rax, %%xmm12\n\t"
        "movabs $0x6060606060606060, %%rax\n\tmovq %%rax, %%xmm13\n\t"
        "movabs $0x7070707070707070, %%rax\n\tmovq %%rax, %%xmm14\n\t"
        "movabs $0x0f0e0d0c0b0a0908, %%rax\n\tmovq %%rax, %%xmm15\n\t"
        "1:\n\t"
        "movq %%xmm0, %%rax\n\tmovabs $0x1111111111111111, %%rdx\n\tcmp %%rdx, %%rax\n\tjne 2f\n\t"
        "movq %%xmm1, %%rax\n\tmovabs $0x2222222222222222, %%rdx\n\tcmp %%rdx, %%rax\n\tjne 2f\n\t"
        "movq %%xmm2, %%rax\n\tmovabs $0x3333333333333333, %%rdx\n\tcmp %%rdx, %%rax\n\tjne 2f\n\t"
        "movq %%xmm3, %%rax\n\tmovabs $0x4444444444444444, %%rdx\n\tcmp %%rdx, %%rax\n\tjne 2f\n\t"
        "movq %%xmm4, %%rax\n\tmovabs $0x5555555555555555, %%rdx\n\tcmp %%rdx, %%rax\n\tjne 2f\n\t"
        "movq %%xmm5, %%rax\n\tmovabs $0x6666666666666666, %%rdx\n\tcmp %%rdx, %%rax\n\tjne 2f\n\t"
        "movq %%xmm6, %%rax\n\tmovabs $0x7777777777777777, %%rdx\n\tcmp %%rdx, %%rax\n\tjne 2f\n\t"
        "movq %%xmm7, %%rax\n\tmovabs $0x0123456789abcdef, %%rdx\n\tcmp %%rdx, %%rax\n\tjne 2f\n\t"
        "movq %%xmm8, %%rax\n\tmovabs $0x1010101010101010, %%rdx\n\tcmp %%rdx, %%rax\n\tjne 2f\n\t"
        "movq %%xmm9, %%rax\n\tmovabs $0x2020202020202020, %%rdx\n\tcmp %%rdx, %%rax\n\tjne 2f\n\t"
        "movq %%xmm10, %%rax\n\tmovabs $0x3030303030303030, %%rdx\n\tcmp %%rdx, %%rax\n\tjne 2f\n\t"
        "movq %%xmm11, %%rax\n\tmovabs $0x4040404040404040, %%rdx\n\tcmp %%rdx, %%rax\n\tjne 2f\n\t"
        "movq %%xmm12, %%rax\n\tmovabs $0x5050505050505050, %%rdx\n\tcmp %%rdx, %%rax\n\tjne 2f\n\t"
        "movq %%xmm13, %%rax\n\tmovabs $0x6060606060606060, %%rdx\n\tcmp %%rdx, %%rax\n\tjne 2f\n\t"
        "movq %%xmm14, %%rax\n\tmovabs $0x7070707070707070, %%rdx\n\tcmp %%rdx, %%rax\n\tjne 2f\n\t"
        "movq %%xmm15, %%rax\n\tmovabs $0x0f0e0d0c0b0a0908, %%rdx\n\tcmp %%rdx, %%rax\n\tjne 2f\n\t"
        "dec %%rcx\n\tjnz 1b\n\t"
        "xor %%eax, %%eax\n\tjmp 3f\n\t"
        "2:\n\tmov $1, %%eax\n\t"
        "3:\n\t"
        : "=a"(bad), "+c"(passes)
        :
        : "rdx", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9",
          "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "cc");
    return bad;
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 2.0;
    time_t end = time(NULL) + (time_t)seconds + 1;
    while (time(NULL) < end) {
        if (block(20000000)) {
            printf("clobbered\n");
            return 1;
        }
    }
    printf("intact\n");
    return 0;
}
