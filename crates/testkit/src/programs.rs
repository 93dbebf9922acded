//! C programs generated for tests and benchmarks.

use std::fmt::Write as _;

/// A C program of `n` short functions (each `noinline`, a few
/// nanoseconds) that its threads call in turn from a table. `argv`: the
/// seconds of work, the seconds idle before and after it (0, 0), and the
/// threads (4, at most 64); prints `done` on stdout and the passes over
/// the table on stderr (`passes N`): each function's calls, to within
/// one a thread (a pass cut short at the end).
pub fn many_functions(n: usize) -> String {
    let mut c = String::from(
        "#include <pthread.h>\n#include <stdio.h>\n#include <stdlib.h>\n#include <time.h>\n\
         typedef unsigned (*fn_t)(unsigned);\n",
    );
    for i in 0..n {
        writeln!(
            c,
            "__attribute__((noinline)) unsigned f{i}(unsigned x) {{ return x * 2654435761u + {i}u; }}"
        )
        .unwrap();
    }
    c.push_str("static fn_t table[] = {");
    for i in 0..n {
        write!(c, "f{i},").unwrap();
    }
    c.push_str(
        "};\nstatic volatile int stop;\nstatic volatile unsigned sink;\n\
         static void *worker(void *a) {\n\
           unsigned acc = (unsigned)(long)a;\n\
           unsigned long passes = 0;\n\
           while (!stop) { for (unsigned i = 0; i < sizeof table / sizeof *table; i++) acc = table[i](acc); passes++; }\n\
           sink = acc;\n\
           return (void *)passes;\n\
         }\n\
         static void nap(double s) {\n\
           struct timespec ts = {(time_t)s, (long)((s - (time_t)s) * 1e9)};\n\
           nanosleep(&ts, NULL);\n\
         }\n\
         /* argv: seconds of work, seconds idle before and after it, threads. */\n\
         int main(int argc, char **argv) {\n\
           double s = argc > 1 ? atof(argv[1]) : 2.0;\n\
           int nt = argc > 4 ? atoi(argv[4]) : 4;\n\
           if (nt < 1 || nt > 64) nt = 4;\n\
           nap(argc > 2 ? atof(argv[2]) : 0.0);\n\
           pthread_t t[64];\n\
           for (long i = 0; i < nt; i++) pthread_create(&t[i], NULL, worker, (void *)i);\n\
           nap(s);\n\
           stop = 1;\n\
           unsigned long passes = 0;\n\
           for (int i = 0; i < nt; i++) { void *r; pthread_join(t[i], &r); passes += (unsigned long)r; }\n\
           nap(argc > 3 ? atof(argv[3]) : 0.0);\n\
           fprintf(stderr, \"passes %lu\\n\", passes);\n\
           printf(\"done\\n\");\n\
           return 0;\n\
         }\n",
    );
    c
}
