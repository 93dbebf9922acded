//! Duration histograms: log-linear buckets (16 exact, then 16 per power of
//! two, 6% wide), stored compactly: only the powers of two a function's
//! samples have reached, one 64-byte line each, typically a handful. (A
//! dense array of every bucket, 4 KiB per function per thread, made each
//! sample's increment a cache and TLB miss.)

/// Buckets over the whole range of `u64` ticks.
pub(crate) const BUCKETS: usize = 1024;

/// Buckets per power of two, and per stored cache line.
const PER_OCTAVE: usize = 16;

/// Bucket of a duration in ticks.
#[inline]
pub(crate) fn bucket(x: u64) -> usize {
    if x < 16 {
        return x as usize;
    }
    let e = 63 - x.leading_zeros() as usize;
    let m = ((x >> (e - 4)) & 15) as usize;
    ((e - 3) * 16 + m).min(BUCKETS - 1)
}

/// Middle of a bucket's range, in ticks.
pub(crate) fn bucket_mid(b: usize) -> f64 {
    if b < 16 {
        return b as f64;
    }
    let e = b / 16 + 3;
    let m = (b % 16) as u64;
    let lo = (16 + m) << (e - 4);
    lo as f64 + (1u64 << (e - 4)) as f64 / 2.0
}

/// Counts per bucket over the octaves reached so far.
#[derive(Clone, Default, Debug)]
pub(crate) struct Hist {
    /// Bucket of `counts[0]` (a multiple of [`PER_OCTAVE`]).
    first: usize,
    /// Counts of buckets `first..first + counts.len()`, whole octaves.
    counts: Vec<u32>,
}

impl Hist {
    /// Counts one duration in ticks.
    #[inline]
    pub(crate) fn add(&mut self, ticks: u64) {
        self.add_n(bucket(ticks), 1);
    }

    #[inline]
    fn add_n(&mut self, b: usize, n: u32) {
        match self.counts.get_mut(b.wrapping_sub(self.first)) {
            Some(c) => *c += n,
            None => self.grow_to(b, n),
        }
    }

    /// Widens the stored range to bucket `b`'s octave and counts `n` there.
    #[cold]
    fn grow_to(&mut self, b: usize, n: u32) {
        let lo = b / PER_OCTAVE * PER_OCTAVE;
        if self.counts.is_empty() {
            self.first = lo;
            self.counts.resize(PER_OCTAVE, 0);
        } else if lo < self.first {
            let mut wider = vec![0; self.first - lo + self.counts.len()];
            wider[self.first - lo..].copy_from_slice(&self.counts);
            self.counts = wider;
            self.first = lo;
        } else {
            self.counts.resize(lo + PER_OCTAVE - self.first, 0);
        }
        self.counts[b - self.first] += n;
    }

    /// Where a duration of `ticks` would be counted, if that octave is
    /// stored (to prefetch it).
    #[inline]
    pub(crate) fn slot(&self, ticks: u64) -> Option<*const u32> {
        self.counts
            .get(bucket(ticks).wrapping_sub(self.first))
            .map(|c| c as *const u32)
    }

    /// Adds `other`'s counts: the stored range widened once to cover
    /// both, then the counts added line by line. (Adding them bucket by
    /// bucket widened it an octave at a time, a reallocation each: merging
    /// a thread's ~800 functions into empty totals took half a millisecond
    /// of SQLite's report.)
    pub(crate) fn merge(&mut self, other: &Hist) {
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
    /// (`n` the sum of the counts); 0 when empty.
    pub(crate) fn percentile(&self, n: u64, q: f64) -> f64 {
        let target = ((n as f64 - 1.0) * q).round() as u64;
        let mut seen = 0u64;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += u64::from(c);
            if seen > target {
                return bucket_mid(self.first + i);
            }
        }
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_monotone_and_tight() {
        let mut last = 0;
        for x in (1..1_000_000u64).step_by(7) {
            let b = bucket(x);
            assert!(b >= last);
            last = b;
            let mid = bucket_mid(b);
            assert!((mid - x as f64).abs() <= 0.035 * x as f64 + 1.0, "{x} -> {b} mid {mid}");
        }
    }

    /// The compact histogram answers every quantile as a dense array of
    /// all buckets would, whichever order its octaves were reached in.
    #[test]
    fn compact_counts_match_a_dense_array() {
        let mut dense = vec![0u32; BUCKETS];
        let mut h = Hist::default();
        let mut other = Hist::default();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut n = 0u64;
        for i in 0..20_000u64 {
            // Durations from 0 ticks to minutes, in a scrambled order.
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let d = (x % 1000) << (x >> 58);
            dense[bucket(d)] += 1;
            if i % 3 == 0 {
                other.add(d)
            } else {
                h.add(d)
            }
            n += 1;
        }
        // Into empty totals, as a report's first thread is; then the rest
        // into them, wider on both sides or not.
        let mut total = Hist::default();
        total.merge(&other);
        total.merge(&h);
        h.merge(&other);
        assert_eq!((total.first, &total.counts), (h.first, &h.counts));
        let mut narrow = Hist::default();
        narrow.add(1 << 20);
        let mut wide = total.clone();
        wide.merge(&narrow);
        narrow.merge(&total);
        assert_eq!((wide.first, &wide.counts), (narrow.first, &narrow.counts));
        let dense_pct = |q: f64| {
            let target = ((n as f64 - 1.0) * q).round() as u64;
            let mut seen = 0u64;
            for (b, &c) in dense.iter().enumerate() {
                seen += u64::from(c);
                if seen > target {
                    return bucket_mid(b);
                }
            }
            0.0
        };
        for q in [0.0, 0.01, 0.1, 0.5, 0.9, 0.99, 0.999, 1.0] {
            assert_eq!(h.percentile(n, q), dense_pct(q), "q = {q}");
        }
        assert!(h.counts.len() % PER_OCTAVE == 0 && h.first % PER_OCTAVE == 0);
        assert_eq!(h.counts.iter().map(|&c| u64::from(c)).sum::<u64>(), n);
    }

    #[test]
    fn an_empty_histogram_has_no_quantiles() {
        assert_eq!(Hist::default().percentile(0, 0.5), 0.0);
    }
}
