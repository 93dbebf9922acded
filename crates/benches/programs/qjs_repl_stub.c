/* qjs links the bytecode of its interactive REPL (repl.js compiled by qjsc).
 * The package ships neither repl.js nor the compiled bytecode, and the
 * evaluation runs scripts, never the REPL: empty modules stand in. */
#include <stdint.h>
const uint8_t qjsc_repl[1] = {0};
const uint32_t qjsc_repl_size = 0;
/* Likewise the calculator mode's bytecode (qjscalc.js, only for --qjscalc). */
const uint8_t qjsc_qjscalc[1] = {0};
const uint32_t qjsc_qjscalc_size = 0;
