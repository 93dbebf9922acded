/* The hot -finstrument-functions function of the eval driver, built at the
 * usual alignment. */
void hot(void) { __asm__ volatile(""); }
