/* A library that a running program loads late (`late_loader.c`), built
 * with sleds: an attached runtime probes it only if it sees it loaded. */
__attribute__((noinline)) long plugin_leaf(long x) { return x * 2654435761L % 1000003; }
__attribute__((noinline)) long plugin_step(long x) { return plugin_leaf(x) + plugin_leaf(x + 1); }
long plugin_work(long n, long seed) {
    long s = 0;
    for (long i = 0; i < n; i++) s += plugin_step(seed + i);
    return s;
}
