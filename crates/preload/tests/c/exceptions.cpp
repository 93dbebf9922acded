// C++ exceptions thrown through instrumented frames.
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

namespace shapes {
struct Thrower {
    int depth;
    __attribute__((noinline)) int dive(int n) {
        if (n == 0) throw std::runtime_error("bottom at depth " + std::to_string(depth));
        depth++;
        return dive(n - 1) + 1;
    }
};
__attribute__((noinline)) int guarded(int n) {
    Thrower t{0};
    try {
        return t.dive(n);
    } catch (const std::runtime_error &e) {
        std::printf("caught: %s\n", e.what());
        return -n;
    }
}
template <typename T> __attribute__((noinline)) T twice(T x) { return x + x; }
}  // namespace shapes

int main() {
    long s = 0;
    for (int i = 1; i <= 5; i++) s += shapes::guarded(i * 3);
    std::vector<int> v;
    for (int i = 0; i < 100; i++) v.push_back(shapes::twice(i));
    for (int x : v) s += x;
    std::printf("sum=%ld twice=%.1f\n", s, shapes::twice(1.25));
    return 0;
}
