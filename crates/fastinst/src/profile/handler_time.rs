//! Time spent in the profiler's handlers, estimated from a sample of them.
//!
//! Timing every handler call took two `rdtsc` of the four a sample read
//! (~26 ticks each here, a fifth of the handlers' own cost) only to report
//! that cost. Instead each call is timed with probability 1/[`ONE_IN`], by
//! a per-thread xorshift draw (a few register operations on a static TLS
//! word), and a timed call counts [`ONE_IN`] times its ticks: an unbiased
//! estimate whose relative error over the thousands of calls of any run
//! worth reading is a few percent at most. A random draw, not every 16th
//! call, so that no regular pattern of calls (entries and exits taking
//! turns, a loop of 16) is timed more or less often than its share. The
//! start and end stamps a sample needs for its duration are shared with it.

use super::Counters;
use std::sync::atomic::AtomicU64;
use wordpatch::tsc;

/// One handler call in this many is timed, on average.
pub(crate) const ONE_IN: u64 = 16;

/// Whether to time this handler call.
#[inline(always)]
pub(super) fn draw() -> bool {
    let mut x = crate::tls::handler_clock() as u32;
    if x == 0 {
        // A thread's first draw: any non-zero seed.
        x = tsc::now() as u32 | 1;
    }
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    crate::tls::set_handler_clock(x as u64);
    // The top bits: xorshift's low bits are its weakest.
    x >> (32 - ONE_IN.trailing_zeros()) == 0
}

/// The handler's start stamp if this call is timed.
#[inline(always)]
pub(super) fn start() -> Option<u64> {
    draw().then(tsc::now)
}

/// Adds the estimate of a call that began at `from` (if timed) and ends at
/// `to` to the thread's own counter `c`.
#[inline(always)]
pub(super) fn account(c: &AtomicU64, from: Option<u64>, to: u64) {
    if let Some(from) = from {
        Counters::add_own(c, to.wrapping_sub(from).wrapping_mul(ONE_IN));
    }
}

/// As [`account`], ending now.
#[inline(always)]
pub(super) fn stop(c: &AtomicU64, from: Option<u64>) {
    if from.is_some() {
        account(c, from, tsc::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn about_one_call_in_sixteen_is_timed_without_pattern() {
        const N: usize = 1 << 20;
        let draws: Vec<bool> = (0..N).map(|_| draw()).collect();
        let timed = draws.iter().filter(|&&d| d).count();
        let expect = N / ONE_IN as usize;
        // Binomial sd is ~250 here; 5% is ~13 sd.
        assert!(timed.abs_diff(expect) < expect / 20, "{timed} timed of {N}");
        // Every residue of a stride as often as any other: entries and
        // exits alternating, or a 16-call loop, get their share.
        for stride in [2usize, 3, 16] {
            for r in 0..stride {
                let n = draws.iter().skip(r).step_by(stride).filter(|&&d| d).count();
                let e = N / stride / ONE_IN as usize;
                assert!(n.abs_diff(e) < e / 10, "stride {stride} residue {r}: {n} of ~{e}");
            }
        }
    }

    #[test]
    fn a_timed_call_counts_for_the_calls_not_timed() {
        let c = AtomicU64::new(0);
        account(&c, None, 100);
        assert_eq!(c.load(std::sync::atomic::Ordering::Relaxed), 0);
        account(&c, Some(40), 100);
        assert_eq!(c.load(std::sync::atomic::Ordering::Relaxed), 60 * ONE_IN);
    }
}
