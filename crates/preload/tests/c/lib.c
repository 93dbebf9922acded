/* An instrumented shared library (linked, and dlopen'd). */
__attribute__((noinline)) int lib_leaf(int x) { return x * 5 + 1; }
__attribute__((noinline)) void lib_void(int *p) { *p += 2; }
int lib_entry(int n) {
    int s = 0;
    for (int i = 0; i < n; i++) {
        s += lib_leaf(i);
        lib_void(&s);
    }
    return s;
}
