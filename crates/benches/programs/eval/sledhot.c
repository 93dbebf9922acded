/* The hot sled function of the eval driver, built with
 * -fpatchable-function-entry=5 at the usual alignment (its sled never
 * straddles a cache line). */
void sled_hot(void) { __asm__ volatile(""); }
