//! The code an active sled runs: per-probe stubs near the module, the shared
//! entry trampoline, and the exit trampoline that substituted return
//! addresses lead to.
//!
//! An active sled is `call stub`. A stub, one per function, lies in a page
//! within ±2 GiB of its module and ends `push <entry probe id>; jmp
//! [rip+slot]`, where `slot` (at the start of the stub area) holds the
//! address of the entry trampoline, which can be anywhere. A function's
//! stub begins with its counting path (`super::counter`), whose counter
//! lies in read-write pages after the stubs.
//!
//! What the trampolines preserve, and why that is enough. gcc turns its
//! inter-procedural register allocation (`-fipa-ra`) off for calls to a
//! function with a patchable entry (checked with gcc 12 at -O2: the caller of a
//! plain static function keeps values in caller-saved registers across the
//! call; with a sled on the callee it keeps them in callee-saved ones), and
//! clang does no such allocation, so a caller assumes only what the ABI
//! promises. That holds for the `-fpatchable-function-entry` option, not for
//! gcc's `patchable_function_entry` attribute on single functions, whose
//! callers' callers may keep values in caller-saved registers across the call
//! unless built with `-fno-ipa-ra` (README, "Known limits"). At the entry, the
//! trampoline therefore preserves what an entry may depend on: the argument
//! registers (`rdi rsi rdx rcx r8 r9`), `rax` (the vector-register count of a
//! varargs call), `r10` (the static chain), `r11`, the arithmetic flags, and
//! the argument vector registers 0–7 at their full width (`xmm`, `ymm` or
//! `zmm`, chosen once from the CPU), and calls the handler with the stack
//! aligned to 64. At the exit it preserves the return registers: `rax rdx`,
//! vector registers 0–1 at full width, and up to two `x87` values (`long
//! double` and its complex form), which it pops and pushes back around the
//! handler so the handler starts with the empty x87 stack the ABI requires.
//!
//! The exit trampoline reserves the slot just below the function's CFA (the
//! one that held its return address), has the runtime write the original
//! return address there, and jumps to it (not `ret`: see the comment at
//! its end).

use super::counter::Counter;
use super::shadow;
use super::stubarea::{counting_stub_bytes, make_area, stub_bytes, Made, Tail};
use std::sync::atomic::{AtomicUsize, Ordering};

crate::arch::trampolines::sled_trampolines!(
    enter: shadow::sled_enter,
    ret: shadow::sled_return,
    flag: crate::clock::FASTINST_CLOCKED,
    end: crate::clock::end_sled
);

/// Vector register width the trampolines preserve.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VectorWidth {
    /// `xmm` (SSE only).
    Xmm,
    /// `ymm` (AVX).
    Ymm,
    /// `zmm` (AVX-512).
    Zmm,
}

/// The widest vector registers this CPU and kernel let code use: what the
/// trampolines must preserve.
pub fn vector_width() -> VectorWidth {
    if std::arch::is_x86_feature_detected!("avx512f") {
        VectorWidth::Zmm
    } else if std::arch::is_x86_feature_detected!("avx") {
        VectorWidth::Ymm
    } else {
        VectorWidth::Xmm
    }
}

fn pick() -> (usize, usize) {
    match vector_width() {
        VectorWidth::Zmm => (
            fastinst_sled_enter_avx512 as *const () as usize,
            fastinst_sled_return_avx512 as *const () as usize,
        ),
        VectorWidth::Ymm => (
            fastinst_sled_enter_avx as *const () as usize,
            fastinst_sled_return_avx as *const () as usize,
        ),
        VectorWidth::Xmm => (
            fastinst_sled_enter_sse as *const () as usize,
            fastinst_sled_return_sse as *const () as usize,
        ),
    }
}

static ENTER: AtomicUsize = AtomicUsize::new(0);

/// The entry trampoline stubs jump to.
pub(crate) fn enter_addr() -> usize {
    init();
    ENTER.load(Ordering::Relaxed)
}

fn init() {
    if ENTER.load(Ordering::Acquire) == 0 {
        let (e, r) = pick();
        shadow::set_return_addr(r);
        ENTER.store(e, Ordering::Release);
    }
}

/// A read+execute area of stubs for `ids` (entry probe ids, one per site,
/// each with whether its stub counts: a function entry's), within `call
/// rel32` reach of every address in `[lo, hi]`, followed by the counters
/// in read+write pages. Returns each stub, in order, or `None` when no
/// memory near enough could be mapped. Stubs are plain where the clock's
/// slot cannot be addressed from generated code.
pub(crate) fn make_stubs(lo: usize, hi: usize, ids: &[(u32, bool)]) -> Option<Vec<Made>> {
    let clock = crate::arch::tls::clock_offset();
    let counts = |&(_, c): &(u32, bool)| c && clock.is_some();
    let n = ids.iter().filter(|x| counts(x)).count();
    let mut next = ids.iter();
    make_area(lo, hi, ids.len(), n, enter_addr(), |at, slot, counter| {
        let x = next.next().expect("one stub per id");
        // A counter only for a counting stub: the area has one for each.
        let counting = clock.filter(|_| counts(x)).and_then(|off| Some((off, counter()?)));
        match counting {
            Some((off, c)) => (
                counting_stub_bytes(Tail::Sled(x.0), at, slot, c as *const Counter as usize, off),
                Some(c),
            ),
            None => (stub_bytes(x.0, at, slot), None),
        }
    })
}

/// Two functions in a fresh page, for measuring what a sled probe costs
/// beyond its stamps (`crate::hookcost`): the first is a sled
/// switched on (`call` to a stub for probe `id`, then `ret`), the second
/// the same sled off (its 5-byte NOP, then `ret`); and the stub's counter
/// when `counting` asks for a counting stub and one could be made. Leaked;
/// `None` when no page near enough for a stub could be mapped.
pub(crate) fn calibration_functions(id: u32, counting: bool) -> Option<(usize, usize, Option<&'static Counter>)> {
    // SAFETY: a fresh private mapping, ours alone until made executable.
    let page = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            wordpatch::PAGE_SIZE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if page == libc::MAP_FAILED {
        return None;
    }
    let at = page as usize;
    let (stub, counter) = make_stubs(at, at + 64, &[(id, counting)])?[0];
    let mut code = [0xCCu8; 32];
    code[0] = 0xE8;
    code[1..5].copy_from_slice(&((stub as i64 - (at + 5) as i64) as i32).to_le_bytes());
    code[5] = 0xC3;
    code[16..21].copy_from_slice(&wordpatch::NOP5);
    code[21] = 0xC3;
    // SAFETY: the page is ours and writable; then it becomes read+execute
    // and is never written again.
    unsafe {
        std::ptr::copy_nonoverlapping(code.as_ptr(), at as *mut u8, code.len());
        if libc::mprotect(page, wordpatch::PAGE_SIZE, libc::PROT_READ | libc::PROT_EXEC) != 0 {
            return None;
        }
    }
    Some((at, at + 16, counter))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stub_pushes_the_id_and_jumps_through_the_slot() {
        let b = stub_bytes(0x1234, 0x10010, 0x10000);
        assert_eq!(&b[..5], &[0x68, 0x34, 0x12, 0, 0]);
        assert_eq!(&b[5..7], &[0xFF, 0x25]);
        let disp = i32::from_le_bytes(b[7..11].try_into().unwrap());
        assert_eq!(0x10010 + 11 + disp as i64, 0x10000);
    }

    /// The counting path run for real: armed, it counts every call and
    /// charges the thread one fast call for each; from the drawn
    /// call on (no handler here claims it, so `next` stays) every call
    /// goes on to the full hook; disarmed, every call does and none is
    /// counted.
    #[test]
    fn a_counting_stub_counts_every_call_and_sends_on_the_drawn_one() {
        std::thread::spawn(|| {
            crate::clock::set_clocked(true);
            let id = shadow::CALIBRATION_ID.get();
            let (on, _, counter) = calibration_functions(id, true).expect("a page near enough");
            let counter = counter.expect("a counting stub");
            // SAFETY: `on` is a calibration function: a call to the stub
            // (which preserves what a call may not clobber) and a return.
            let call = || unsafe { crate::arch::stubs::call_address(on) };
            call();
            let clock = crate::clock::current().expect("the hook made this thread's clock");
            assert_eq!(counter.calls(), 0, "disarmed: not counted");
            let (h0, f0) = (clock.hooks(), clock.fast_calls());
            let from = counter.arm(0, || 10);
            for _ in 0..100 {
                call();
            }
            assert_eq!(counter.calls() - from, 100);
            // Each is charged the path, the ones sent on as well (their
            // hooks' stamps begin after it).
            assert_eq!(clock.fast_calls() - f0, 100);
            // The calibration id's exit is watched: two hooks a call.
            assert_eq!(clock.hooks() - h0, 2 * 91);
            counter.disarm();
            let (c1, h1) = (counter.calls(), clock.hooks());
            for _ in 0..5 {
                call();
            }
            assert_eq!((counter.calls(), clock.hooks() - h1), (c1, 10));
        })
        .join()
        .unwrap();
    }

    /// Threads calling one counting stub at once, each in its lane: every
    /// call is counted once, in the counter and in its own thread's fast
    /// calls, and the threads that got their clocks one after another
    /// count in different lanes.
    #[test]
    fn concurrent_callers_count_every_call_in_their_own_lanes() {
        const THREADS: usize = 4;
        const CALLS: u64 = 200_000;
        crate::clock::set_clocked(true);
        let id = shadow::CALIBRATION_ID.get();
        let (on, _, counter) = calibration_functions(id, true).expect("a page near enough");
        let counter = counter.expect("a counting stub");
        // SAFETY: as in the test above: a call to the stub and a return.
        let call = move || unsafe { crate::arch::stubs::call_address(on) };
        // Each thread's first call, disarmed, runs the hook that makes its
        // clock; then all count together.
        let ready = std::sync::Barrier::new(THREADS + 1);
        let armed = std::sync::Barrier::new(THREADS + 1);
        let lanes = std::thread::scope(|s| {
            let threads: Vec<_> = (0..THREADS)
                .map(|_| {
                    s.spawn(|| {
                        call();
                        let clock = crate::clock::current().expect("the hook made this thread's clock");
                        ready.wait();
                        armed.wait();
                        let f0 = clock.fast_calls();
                        for _ in 0..CALLS {
                            call();
                        }
                        assert_eq!(clock.fast_calls() - f0, CALLS, "every call took the counting path");
                        clock.lane()
                    })
                })
                .collect();
            ready.wait();
            let from = counter.arm(0, || u64::MAX / 2);
            armed.wait();
            let lanes: Vec<usize> = threads.into_iter().map(|t| t.join().unwrap()).collect();
            assert_eq!(counter.calls() - from, THREADS as u64 * CALLS);
            counter.disarm();
            lanes
        });
        let mut distinct = lanes.clone();
        distinct.sort_unstable();
        distinct.dedup();
        // Other tests' threads may have taken clocks between these
        // threads', so consecutive is not guaranteed; most are apart.
        assert!(distinct.len() >= 2, "lanes {lanes:?}");
    }
}
