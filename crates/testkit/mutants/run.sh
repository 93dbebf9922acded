#!/bin/bash
# Deliberately broken builds: each mutation applied alone, the suite's
# tests that should catch it run as CI runs them, the mutation reverted.
# Prints "caught" or "NOT CAUGHT" for each. About two minutes when built.
# See docs/testing.md, "Deliberately broken builds".
set -u
cd "$(dirname "$0")/../../.."
if [ -n "$(git status --porcelain crates)" ]; then
  echo "crates/ has uncommitted changes: each mutant is reverted with git checkout" >&2
  exit 2
fi
run() { # name, test command
  echo "=== mutant: $1"; shift
  if "$@" > /tmp/mutant.log 2>&1; then echo "NOT CAUGHT"; else echo "caught:"; grep -E "panicked at|FAILED|failed:|error\[" /tmp/mutant.log | head -4; grep -E "test result" /tmp/mutant.log | grep -v " 0 failed" | head -2; fi
  git checkout -q crates/
}
trap 'git checkout -q crates/' EXIT
# mutate FILE: replaces, in FILE, the text on stdin before a line `=====`
# by the text after it; the text must occur exactly once.
mutate() {
  python3 -c '
import sys
path = sys.argv[1]
old, new = sys.stdin.read().split("\n=====\n")
s = open(path).read()
assert s.count(old) == 1, f"{path}: the text to mutate occurs {s.count(old)} times"
open(path, "w").write(s.replace(old, new.rstrip("\n")))
' "$1"
  git diff --stat | tail -1
}
# M1: a renumbered status code (ENOFUNCTION -3 -> -8 in the Rust table).
mutate crates/fastinst/src/c_abi.rs <<'M'
        code: -3,
        name: "FASTINST_ENOFUNCTION",
=====
        code: -8,
        name: "FASTINST_ENOFUNCTION",
M
run "renumbered status code" cargo test --release -p fastinst-preload --test c_abi
# M2: a swallowed error return (fastinst_deactivate reports success whatever happened).
mutate crates/preload/src/capi.rs <<'M'
    guard(|| fastinst::deactivate(id).map(|_| 0))
=====
    guard(|| {
        let _ = fastinst::deactivate(id);
        Ok(0)
    })
M
# The C programs load the cdylib, which only a build (or the whole
# workspace's test) refreshes.
cargo build --release -q -p fastinst-preload
run "swallowed error return" cargo test --release --workspace --test e2e -- c_api_program
# M3: a CLI option parsed but ignored (--epoch-ms never reaches the runtime).
mutate crates/cli/src/run.rs <<'M'
            r.env.push(("FASTINST_PROFILE_EPOCH_MS", a_value(ms)));
=====
            let _ = a_value(ms);
M
run "option parsed but ignored" cargo test --release -p fastinst-cli --test cli -- every_run_option_reaches_the_runtime
# M4: a toggle that tears once in 10^7, at one split only.
mutate crates/callpatch/src/site.rs <<'M'
        let at = (self.addr + v.start) as *mut u8;
        // SAFETY: the region lies in one line
=====
        let at = (self.addr + v.start) as *mut u8;
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        if self.addr % 64 == 62 && N.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 10_000_000 == 9_999_999 {
            // SAFETY: the mutant: a torn state held for a moment.
            let _ = unsafe { store_in_line(at, &[0xCC; 8][..v.len], None) };
            let t = wordpatch::tsc::now();
            while wordpatch::tsc::now() - t < 100_000 {}
            // SAFETY: as below.
            let _ = unsafe { store_in_line(at, &from[r.clone()], None) };
        }
        // SAFETY: the region lies in one line
M
run "toggle torn once in 10^7 at one split" cargo test --release -p stress --test stress -- callpatch_flip_every_form_and_split
# The cdylib the second mutant built goes back to the real code.
cargo build --release -q -p fastinst-preload
