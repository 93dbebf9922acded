/* Instrumented code for the invocation and toggle benchmarks. */
#include <stdint.h>
__attribute__((noinline)) void empty_probe(void) { __asm__ volatile(""); }
#define F(i) __attribute__((noinline)) void t##i(void) { __asm__ volatile(""); }
#define F10(i) F(i##0) F(i##1) F(i##2) F(i##3) F(i##4) F(i##5) F(i##6) F(i##7) F(i##8) F(i##9)
#define F100(i) F10(i##0) F10(i##1) F10(i##2) F10(i##3) F10(i##4) F10(i##5) F10(i##6) F10(i##7) F10(i##8) F10(i##9)
F100(1) F100(2) F100(3) F100(4) F100(5) F100(6) F100(7) F100(8) F100(9) F100(10)
#undef F
#define F(i) t##i,
void (*const all_fns[])(void) = { F100(1) F100(2) F100(3) F100(4) F100(5) F100(6) F100(7) F100(8) F100(9) F100(10) };
const int n_fns = sizeof all_fns / sizeof *all_fns;
