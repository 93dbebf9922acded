//! Which counted calls are timed, and what each timed call stands for.
//!
//! Every call a window (or a whole function's probe) counts is timed by an
//! independent draw with chance `2^-j`, the shift `j` fixed by the sampler
//! before the window opens, from the calls it expects there and the timed
//! calls it wants ([`shift_for`]). A timed call then stands for `2^j`
//! calls: its weight in every mean, histogram, edge and path. The windows
//! lie at random times fixed in advance, so each call is inside one with
//! the same chance; the draw keeps that equality among the calls inside;
//! and the weights undo the different chances of different windows. So
//! the timed calls are a sample of the function's calls, each call as
//! likely as any other, whatever the program's phases (a Hájek estimator).
//!
//! What this replaced: the first K calls of each function after the start
//! of a timing epoch. A call is first after a random instant in proportion
//! to the gap before it, so those calls came mostly from the program's
//! slow, sparse stretches and from just after long pauses, when caches are
//! cold: Lua's `luaH_getshortstr` (a 3 ns leaf called 5.7 M times) read
//! 25-40 ns a call and five to ten times its traced inclusive time, and
//! every short, hot function of an interpreter read high. Timing the
//! calls drawn inside the windows read it at 4-6 ns.

/// The largest shift: a timed call stands for at most `2^16` calls. A
/// window holds at most a few tens of thousands of counted calls (the
/// density setting's counted calls per tick of exposure, over at most
/// [`super::schedule::MAX_WINDOW_US`]), so this bound is seldom reached;
/// where it is, more calls are timed than wanted, and none is lost.
pub const MAX_SHIFT: u8 = 16;

/// The shift for a stretch expected to hold `calls` counted calls, of
/// which about `want` should be timed: the least `j` with
/// `calls / 2^j <= want`, at most [`MAX_SHIFT`]; 0 (every call) for a
/// stretch expected to hold no more than `want`, or with no expectation.
///
/// Plain arithmetic, no `libm` call: the raw sampler thread, which runs
/// this, must not enter the C library (`crate::rawthread`).
pub(crate) fn shift_for(calls: f64, want: f64) -> u8 {
    // NaN compares false both ways: no expectation, every call.
    if calls.is_nan() || want.is_nan() || calls <= want || want <= 0.0 {
        return 0;
    }
    let mut j = 0;
    let mut timed = calls;
    while timed > want && j < MAX_SHIFT {
        timed /= 2.0;
        j += 1;
    }
    j
}

/// Whether the call whose draw is `r` (uniform over `u64`) is timed at
/// shift `j`: its top `j` bits are all zero.
#[inline(always)]
pub(crate) fn chosen(j: u8, r: u64) -> bool {
    j == 0 || r >> (64 - u32::from(j.min(MAX_SHIFT))) == 0
}

/// The calls a call timed at shift `j` stands for.
#[inline(always)]
pub(crate) fn weight(j: u8) -> u32 {
    1 << j.min(MAX_SHIFT)
}

/// Where the call to time next lies, counted from the one after the last:
/// a draw of the geometric distribution of chance `2^-j` (1 is the very
/// next call), from the uniform draw `r`. A sled's counting stub times
/// the calls these gaps lead to (`crate::sled::counter`), which is the
/// same as [`chosen`] drawing each call alone.
///
/// Plain arithmetic, as [`shift_for`]: the raw sampler runs it.
pub(crate) fn gap(j: u8, r: u64) -> u64 {
    let j = j.min(MAX_SHIFT);
    if j == 0 {
        return 1;
    }
    // u in (0, 1]; P(G > k) = (1 - p)^k.
    let u = ((r >> 11) + 1) as f64 / (1u64 << 53) as f64;
    let p = 1.0 / f64::from(weight(j));
    let k = ln(u) / ln(1.0 - p);
    // At most 2^40 calls on: a window holds far fewer.
    1 + (k.clamp(0.0, (1u64 << 40) as f64)) as u64
}

/// The natural logarithm of `x > 0` without `libm` (the raw sampler must
/// not enter the C library): `x = m 2^e` with `m` in `[1, 2)`, and
/// `ln m = 2 atanh((m - 1) / (m + 1))` by its series, whose terms shrink
/// ninefold each at worst.
fn ln(x: f64) -> f64 {
    let bits = x.to_bits();
    let e = ((bits >> 52) & 0x7ff) as i64 - 1023;
    let m = f64::from_bits((bits & ((1u64 << 52) - 1)) | (1023u64 << 52));
    let s = (m - 1.0) / (m + 1.0);
    let (s2, mut term, mut sum) = (s * s, s, 0.0);
    for k in 0..14 {
        sum += term / f64::from(2 * k + 1);
        term *= s2;
    }
    e as f64 * std::f64::consts::LN_2 + 2.0 * sum
}

/// The next draw of a thread's generator (xorshift64*; `state` never 0).
#[inline(always)]
pub(crate) fn draw(state: &mut u64) -> u64 {
    let mut x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    x.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

/// A generator's first state, from `seed` (never 0).
pub(crate) fn seed(seed: u64) -> u64 {
    // splitmix64's finaliser spreads neighbouring seeds (thread ids, clock
    // readings) over the whole state.
    let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)) | 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shift_times_about_the_calls_wanted() {
        assert_eq!(shift_for(0.0, 5.0), 0);
        assert_eq!(shift_for(5.0, 5.0), 0, "no more than wanted: every call");
        assert_eq!(shift_for(6.0, 5.0), 1);
        assert_eq!(shift_for(f64::NAN, 5.0), 0);
        assert_eq!(shift_for(100.0, 0.0), 0);
        assert_eq!(shift_for(1e12, 1.0), MAX_SHIFT);
        for calls in [7.0, 100.0, 1_500.0, 40_000.0] {
            let j = shift_for(calls, 5.0);
            let timed = calls / f64::from(weight(j));
            assert!(timed <= 5.0 && timed > 2.5, "{calls} calls at shift {j}: {timed} timed");
        }
    }

    #[test]
    fn a_call_is_chosen_with_its_shifts_chance() {
        let mut state = seed(42);
        for j in [0u8, 1, 3, 6] {
            let n = 200_000;
            let k = (0..n).filter(|_| chosen(j, draw(&mut state))).count() as f64;
            let p = 1.0 / f64::from(weight(j));
            let sd = (n as f64 * p * (1.0 - p)).sqrt();
            assert!((k - n as f64 * p).abs() <= 5.0 * sd + 1.0, "shift {j}: {k} of {n}");
        }
    }

    #[test]
    fn the_logarithm_matches_the_c_librarys() {
        for x in [1e-300, 1e-16, 0.001, 0.3, 0.5, 0.999_999, 1.0, 1.5, 2.0, 7.0, 1e9] {
            let (ours, libm) = (ln(x), x.ln());
            assert!(
                (ours - libm).abs() <= 1e-12 * libm.abs().max(1.0),
                "ln {x}: {ours} against {libm}"
            );
        }
    }

    /// Gaps of chance `2^-j` time one call in `2^j`, each call alike: the
    /// share of calls they time, and how they spread (a geometric
    /// distribution's variance `(1 - p) / p^2`).
    #[test]
    fn gaps_time_each_call_with_its_shifts_chance() {
        let mut state = seed(9);
        assert_eq!(gap(0, draw(&mut state)), 1);
        for j in [1u8, 3, 8, 16] {
            let p = 1.0 / f64::from(weight(j));
            let n = 40_000;
            let gaps: Vec<f64> = (0..n).map(|_| gap(j, draw(&mut state)) as f64).collect();
            assert!(gaps.iter().all(|&g| g >= 1.0));
            let mean = gaps.iter().sum::<f64>() / n as f64;
            let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / n as f64;
            let sd_of_mean = ((1.0 - p) / (p * p) / n as f64).sqrt();
            assert!((mean - 1.0 / p).abs() <= 5.0 * sd_of_mean, "shift {j}: mean gap {mean}");
            let want = (1.0 - p) / (p * p);
            assert!(
                (var / want - 1.0).abs() < 0.1,
                "shift {j}: variance {var} against {want}"
            );
        }
    }

    /// The estimator this module exists for: calls in two phases, a dense
    /// one of fast calls and a sparse one of slow calls, equally long in
    /// time. Windows at random instants with a shift fixed per window from
    /// the phase's expected calls, each timed call weighted by its shift,
    /// give the mean of all calls; the first K calls after each random
    /// instant give (nearly) the mean of the two phases' means.
    #[test]
    fn weighted_draws_in_random_windows_give_the_mean_of_all_calls() {
        // Phase 0: a call every tick lasting 1; phase 1: a call every 100
        // ticks lasting 50. Each phase 10,000 ticks, alternating.
        let phase = |t: u64| (t / 10_000) % 2;
        let calls_at = |t0: u64, t1: u64| -> Vec<u64> {
            (t0..t1)
                .filter(|&t| if phase(t) == 0 { true } else { t % 100 == 0 })
                .collect()
        };
        let dur = |t: u64| if phase(t) == 0 { 1.0 } else { 50.0 };
        let span = 2_000_000u64;
        let all = calls_at(0, span);
        let truth = all.iter().map(|&t| dur(t)).sum::<f64>() / all.len() as f64;

        let mut state = seed(7);
        let (mut wsum, mut w) = (0.0, 0.0);
        let (mut first_sum, mut first_n) = (0.0, 0.0);
        for _ in 0..4_000 {
            let at = draw(&mut state) % (span - 500);
            let inside = calls_at(at, at + 500);
            // The sampler's expectation: the phase's rate at the window's start.
            let expected = if phase(at) == 0 { 500.0 } else { 5.0 };
            let j = shift_for(expected, 4.0);
            for &t in &inside {
                if chosen(j, draw(&mut state)) {
                    wsum += dur(t) * f64::from(weight(j));
                    w += f64::from(weight(j));
                }
            }
            for &t in inside.iter().take(4) {
                first_sum += dur(t);
                first_n += 1.0;
            }
        }
        let weighted = wsum / w;
        let first = first_sum / first_n;
        assert!(
            (weighted - truth).abs() <= 0.1 * truth,
            "weighted {weighted}, truth {truth}"
        );
        assert!(
            first > 10.0 * truth,
            "the first calls' mean {first} should show the old bias against {truth}"
        );
    }
}
