//! Duration histograms: log-linear buckets (`2^B` exact, then `2^B` per
//! power of two, `2^-B` wide relative to the octave: 6% at the profiler's
//! `B = 4`, under 1% at the trace tool's `B = 7`), stored compactly: only
//! the powers of two a function's samples have reached, typically a
//! handful. (A dense array of every bucket, 4 KiB per function per thread,
//! made each sample's increment a cache and TLB miss.) A count is of the
//! calls the timed ones stand for (the profiler weights each; the trace
//! tool counts each once), so 64 bits: a hot function's weighted count
//! passes 2^32 in a long run.

/// Sub-bucket bits of the profiler's histograms: 16 per octave, each 6%
/// wide, two 64-byte lines per octave.
pub(crate) const PROFILE_BITS: u32 = 4;

/// Buckets over the whole range of `u64` ticks with `B` sub-bucket bits.
#[cfg(test)]
pub(crate) const fn buckets(b: u32) -> usize {
    (66 - b as usize) << b
}

/// Bucket of a duration in ticks.
#[inline]
pub(crate) fn bucket<const B: u32>(x: u64) -> usize {
    if x < (1 << B) {
        return x as usize;
    }
    let e = 63 - x.leading_zeros();
    let m = ((x >> (e - B)) & ((1 << B) - 1)) as usize;
    ((e - B + 1) as usize) * (1 << B) + m
}

/// Middle of a bucket's range, in ticks.
pub(crate) fn bucket_mid<const B: u32>(b: usize) -> f64 {
    if b < (1 << B) {
        return b as f64;
    }
    let e = (b >> B) as u32 + B - 1;
    let m = (b & ((1 << B) - 1)) as u64;
    let lo = ((1u64 << B) + m) << (e - B);
    lo as f64 + (1u64 << (e - B)) as f64 / 2.0
}

/// Counts per bucket over the octaves reached so far.
#[derive(Clone, Default, Debug)]
pub(crate) struct Hist<const B: u32 = PROFILE_BITS> {
    /// Bucket of `counts[0]` (a multiple of `2^B`).
    first: usize,
    /// Counts of buckets `first..first + counts.len()`, whole octaves.
    counts: Vec<u64>,
}

impl<const B: u32> Hist<B> {
    const PER_OCTAVE: usize = 1 << B;

    /// A bucket's half-width relative to the durations it holds, at most:
    /// how far a percentile (a bucket's middle) may stand from the
    /// duration it stands for.
    pub(crate) const HALF_BUCKET: f64 = 1.0 / (1u64 << (B + 1)) as f64;

    /// Counts one duration in ticks.
    #[inline]
    pub(crate) fn add(&mut self, ticks: u64) {
        self.add_n(bucket::<B>(ticks), 1);
    }

    /// Counts one duration in ticks that stands for `w` calls.
    #[inline]
    pub(crate) fn add_weighted(&mut self, ticks: u64, w: u64) {
        self.add_n(bucket::<B>(ticks), w);
    }

    #[inline]
    fn add_n(&mut self, b: usize, n: u64) {
        match self.counts.get_mut(b.wrapping_sub(self.first)) {
            Some(c) => *c += n,
            None => self.grow_to(b, n),
        }
    }

    /// Widens the stored range to bucket `b`'s octave and counts `n` there.
    #[cold]
    fn grow_to(&mut self, b: usize, n: u64) {
        let lo = b / Self::PER_OCTAVE * Self::PER_OCTAVE;
        if self.counts.is_empty() {
            self.first = lo;
            self.counts.resize(Self::PER_OCTAVE, 0);
        } else if lo < self.first {
            let mut wider = vec![0; self.first - lo + self.counts.len()];
            wider[self.first - lo..].copy_from_slice(&self.counts);
            self.counts = wider;
            self.first = lo;
        } else {
            self.counts.resize(lo + Self::PER_OCTAVE - self.first, 0);
        }
        self.counts[b - self.first] += n;
    }

    /// Where a duration of `ticks` would be counted, if that octave is
    /// stored (to prefetch it).
    #[inline]
    pub(crate) fn slot(&self, ticks: u64) -> Option<*const u64> {
        self.counts
            .get(bucket::<B>(ticks).wrapping_sub(self.first))
            .map(|c| c as *const u64)
    }

    /// Adds `other`'s counts: the stored range widened once to cover
    /// both, then the counts added line by line. (Adding them bucket by
    /// bucket widened it an octave at a time, a reallocation each.)
    pub(crate) fn merge(&mut self, other: &Hist<B>) {
        if other.counts.is_empty() {
            return;
        }
        if self.counts.is_empty() {
            self.first = other.first;
            self.counts.clone_from(&other.counts);
            return;
        }
        let lo = self.first.min(other.first);
        let hi = (self.first + self.counts.len()).max(other.first + other.counts.len());
        if lo < self.first || hi > self.first + self.counts.len() {
            let mut wider = vec![0; hi - lo];
            wider[self.first - lo..][..self.counts.len()].copy_from_slice(&self.counts);
            self.counts = wider;
            self.first = lo;
        }
        let at = other.first - self.first;
        for (c, &o) in self.counts[at..].iter_mut().zip(&other.counts) {
            *c += o;
        }
    }

    /// The middle of the bucket holding the `q`-quantile of `n` samples
    /// (`n` the sum of the counts): the sample of rank `round((n - 1) q)`
    /// (0-based) in sorted order, to within half a bucket; 0 when empty.
    pub(crate) fn percentile(&self, n: u64, q: f64) -> f64 {
        let target = ((n as f64 - 1.0) * q).round() as u64;
        let mut seen = 0u64;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen > target {
                return bucket_mid::<B>(self.first + i);
            }
        }
        0.0
    }

    /// The sum of squared distances of the counted durations from `mean`,
    /// each taken at its bucket's middle (within half a bucket, 3%, of
    /// the duration): `n - 1` times their variance when `mean` is theirs.
    pub(crate) fn squares_about(&self, mean: f64) -> f64 {
        self.iter().map(|(m, c)| c as f64 * (m - mean) * (m - mean)).sum()
    }

    /// Whether nothing was counted.
    pub(crate) fn is_empty(&self) -> bool {
        self.counts.iter().all(|&c| c == 0)
    }

    /// Every stored bucket's middle and count, in order (for tests and
    /// merging into another resolution).
    pub(crate) fn iter(&self) -> impl Iterator<Item = (f64, u64)> + '_ {
        self.counts
            .iter()
            .enumerate()
            .filter(|(_, &c)| c > 0)
            .map(|(i, &c)| (bucket_mid::<B>(self.first + i), c))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_monotone_and_tight() {
        let mut last = 0;
        for x in (1..1_000_000u64).step_by(7) {
            let b = bucket::<4>(x);
            assert!(b >= last && b < buckets(4));
            last = b;
            let mid = bucket_mid::<4>(b);
            assert!((mid - x as f64).abs() <= 0.035 * x as f64 + 1.0, "{x} -> {b} mid {mid}");
            let fine = bucket_mid::<7>(bucket::<7>(x));
            assert!((fine - x as f64).abs() <= 0.004 * x as f64 + 1.0, "{x} fine mid {fine}");
        }
    }

    /// The compact histogram answers every quantile as a dense array of
    /// all buckets would, whichever order its octaves were reached in.
    #[test]
    fn compact_counts_match_a_dense_array() {
        let mut dense = vec![0u64; buckets(4)];
        let mut h = Hist::<4>::default();
        let mut other = Hist::<4>::default();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut n = 0u64;
        for i in 0..20_000u64 {
            // Durations from 0 ticks to minutes, in a scrambled order.
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let d = (x % 1000) << (x >> 58);
            dense[bucket::<4>(d)] += 1;
            if i % 3 == 0 {
                other.add(d)
            } else {
                h.add(d)
            }
            n += 1;
        }
        // Into empty totals, as a report's first thread is; then the rest
        // into them, wider on both sides or not.
        let mut total = Hist::<4>::default();
        total.merge(&other);
        total.merge(&h);
        h.merge(&other);
        assert_eq!((total.first, &total.counts), (h.first, &h.counts));
        let mut narrow = Hist::<4>::default();
        narrow.add(1 << 20);
        let mut wide = total.clone();
        wide.merge(&narrow);
        narrow.merge(&total);
        assert_eq!((wide.first, &wide.counts), (narrow.first, &narrow.counts));
        let dense_pct = |q: f64| {
            let target = ((n as f64 - 1.0) * q).round() as u64;
            let mut seen = 0u64;
            for (b, &c) in dense.iter().enumerate() {
                seen += c;
                if seen > target {
                    return bucket_mid::<4>(b);
                }
            }
            0.0
        };
        for q in [0.0, 0.01, 0.1, 0.5, 0.9, 0.99, 0.999, 1.0] {
            assert_eq!(h.percentile(n, q), dense_pct(q), "q = {q}");
        }
        assert!(h.counts.len() % 16 == 0 && h.first % 16 == 0);
        assert_eq!(h.counts.iter().sum::<u64>(), n);
    }

    /// Quantiles against the exact order statistics of the sorted samples
    /// (not the histogram's own formula): within half a bucket's width of
    /// the sample of rank `round((n - 1) q)`, at both resolutions and over
    /// spreads from a few ticks to seconds.
    #[test]
    fn quantiles_are_the_sorted_samples_to_within_half_a_bucket() {
        fn check<const B: u32>(samples: &[u64], tol: f64) {
            let mut h = Hist::<B>::default();
            for &d in samples {
                h.add(d);
            }
            let mut sorted = samples.to_vec();
            sorted.sort_unstable();
            let n = sorted.len() as u64;
            for q in [0.0, 0.01, 0.25, 0.5, 0.9, 0.99, 0.999, 1.0] {
                let exact = sorted[((n as f64 - 1.0) * q).round() as usize] as f64;
                let got = h.percentile(n, q);
                assert!(
                    (got - exact).abs() <= tol * exact + 1.0,
                    "B={B} q={q}: {got} against the exact {exact}"
                );
            }
        }
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for spread in [4u32, 12, 24, 40] {
            let samples: Vec<u64> = (0..5_000).map(|_| 1 + next() % (1u64 << spread)).collect();
            check::<4>(&samples, 1.0 / 32.0 + 1e-9);
            check::<7>(&samples, 1.0 / 256.0 + 1e-9);
            // Log-uniform, as latencies spread over octaves are.
            let samples: Vec<u64> = (0..5_000)
                .map(|_| (1 + (next() % 1000)) << (next() % spread as u64))
                .collect();
            check::<4>(&samples, 1.0 / 32.0 + 1e-9);
            check::<7>(&samples, 1.0 / 256.0 + 1e-9);
        }
    }

    #[test]
    fn an_empty_histogram_has_no_quantiles() {
        assert_eq!(Hist::<4>::default().percentile(0, 0.5), 0.0);
    }
}
