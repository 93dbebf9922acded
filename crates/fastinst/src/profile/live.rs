//! The sampling settings as they stand: read from the environment at
//! start ([`Settings`]), changeable while the program runs through the
//! control socket's `set` ([`crate::control`]), as `fastinst ctl PID set
//! samples=40` does.
//!
//! Each is one atomic word, read by the sampler as it plans each epoch and
//! by the counting handler (the whole-counting overflow), so a change
//! takes effect from the next epoch. Estimates stay unbiased across a
//! change: every window's calls are scaled by that window's own exposure,
//! and every timed call carries the weight of the chance it was drawn
//! with.

use super::settings::Settings;
use super::window;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

/// The settings a `set` may change, and their bounds.
pub(crate) const KEYS: &str = "samples=2..1000, windows=1..64, density=1..1000, share=1..90, epoch-ms=1..1000";

/// The live sampling settings.
pub(crate) struct Live {
    samples: AtomicU32,
    windows: AtomicU32,
    density: AtomicU32,
    share: AtomicU32,
    epoch_ns: AtomicU64,
    whole_overflow: AtomicU64,
    changes: AtomicU32,
}

impl Live {
    pub(crate) fn new(s: &Settings) -> Live {
        let l = Live {
            samples: AtomicU32::new(s.samples),
            windows: AtomicU32::new(s.windows as u32),
            density: AtomicU32::new(s.density),
            share: AtomicU32::new(s.share),
            epoch_ns: AtomicU64::new(s.epoch.as_nanos() as u64),
            whole_overflow: AtomicU64::new(0),
            changes: AtomicU32::new(0),
        };
        l.rescale();
        l
    }

    /// Calls timed per function per epoch, about (K).
    pub(crate) fn samples(&self) -> u32 {
        self.samples.load(Ordering::Relaxed)
    }

    /// Counting windows per windowed function per epoch.
    pub(crate) fn windows(&self) -> usize {
        self.windows.load(Ordering::Relaxed) as usize
    }

    /// Counting hooks per tick of program time that the open windows may
    /// run together ([`Settings::density`] over 1,000).
    pub(crate) fn density(&self) -> f64 {
        f64::from(self.density.load(Ordering::Relaxed)) / 1000.0
    }

    /// [`Settings::density`] as set.
    pub(crate) fn density_setting(&self) -> u32 {
        self.density.load(Ordering::Relaxed)
    }

    /// The share of the threads' CPU time the profiler holds itself to
    /// ([`Settings::share`] over 100).
    pub(crate) fn share(&self) -> f64 {
        f64::from(self.share_setting()) / 100.0
    }

    /// [`Settings::share`] as set (percent).
    pub(crate) fn share_setting(&self) -> u32 {
        self.share.load(Ordering::Relaxed)
    }

    /// The epoch's mean length.
    pub(crate) fn epoch(&self) -> Duration {
        Duration::from_nanos(self.epoch_ns.load(Ordering::Relaxed))
    }

    /// The epoch's length over the default's, at least 1 (see
    /// [`Settings::epoch_scale`]).
    pub(crate) fn epoch_scale(&self) -> f64 {
        (self.epoch().as_secs_f64() / 0.010).max(1.0)
    }

    /// [`window::WHOLE_OVERFLOW`] scaled to the epoch, for the counting
    /// handler.
    #[inline(always)]
    pub(crate) fn whole_overflow(&self) -> u64 {
        self.whole_overflow.load(Ordering::Relaxed)
    }

    /// How many `set`s changed something.
    pub(crate) fn changes(&self) -> u32 {
        self.changes.load(Ordering::Relaxed)
    }

    fn rescale(&self) {
        let o = (window::WHOLE_OVERFLOW as f64 * self.epoch_scale()) as u64;
        self.whole_overflow.store(o, Ordering::Relaxed);
    }

    /// Applies `KEY=VALUE` words (`samples`, `windows`, `density`,
    /// `share`, `epoch-ms`), all
    /// or none: a word that does not parse or is out of bounds changes
    /// nothing and says why. Returns the settings as they now stand.
    pub(crate) fn set(&self, words: &str) -> Result<String, String> {
        let mut samples = None;
        let mut windows = None;
        let mut density = None;
        let mut share = None;
        let mut epoch = None;
        for w in words.split_whitespace() {
            let (k, v) = w
                .split_once('=')
                .ok_or_else(|| format!("`{w}` is not KEY=VALUE ({KEYS})"))?;
            let bad = || format!("`{w}`: out of bounds ({KEYS})");
            let within =
                |r: std::ops::RangeInclusive<u32>| v.parse::<u32>().ok().filter(|n| r.contains(n)).ok_or_else(bad);
            match k {
                "samples" => samples = Some(within(2..=1000)?),
                "windows" => windows = Some(within(1..=64)?),
                "density" => density = Some(within(1..=1000)?),
                "share" => share = Some(within(1..=90)?),
                "epoch-ms" => {
                    let ms = v
                        .parse::<f64>()
                        .ok()
                        .filter(|m| (1.0..=1000.0).contains(m))
                        .ok_or_else(bad)?;
                    epoch = Some((ms * 1e6) as u64);
                }
                _ => return Err(format!("unknown setting `{k}` ({KEYS})")),
            }
        }
        if samples.is_none() && windows.is_none() && density.is_none() && share.is_none() && epoch.is_none() {
            return Err(format!("nothing to set ({KEYS})"));
        }
        if let Some(n) = samples {
            self.samples.store(n, Ordering::Relaxed);
        }
        if let Some(n) = windows {
            self.windows.store(n, Ordering::Relaxed);
        }
        if let Some(n) = density {
            self.density.store(n, Ordering::Relaxed);
        }
        if let Some(n) = share {
            self.share.store(n, Ordering::Relaxed);
        }
        if let Some(ns) = epoch {
            self.epoch_ns.store(ns, Ordering::Relaxed);
            self.rescale();
        }
        self.changes.fetch_add(1, Ordering::Relaxed);
        Ok(self.describe())
    }

    /// `samples=K windows=W density=D share=S epoch-ms=E`.
    pub(crate) fn describe(&self) -> String {
        format!(
            "samples={} windows={} density={} share={} epoch-ms={}",
            self.samples(),
            self.windows(),
            self.density_setting(),
            self.share_setting(),
            self.epoch().as_secs_f64() * 1e3
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_set_changes_all_it_names_or_nothing() {
        let l = Live::new(&Settings::default());
        let before = l.describe();
        assert_eq!(
            before,
            format!(
                "samples=10 windows=2 density=20 share={} epoch-ms=10",
                super::super::budget::DEFAULT_SHARE
            )
        );
        assert_eq!(l.whole_overflow(), window::WHOLE_OVERFLOW);
        for bad in [
            "samples=1",
            "samples=40 windows=0",
            "density=0",
            "density=1001 samples=40",
            "share=0",
            "share=91 density=10",
            "epoch-ms=x",
            "color=red",
            "samples",
            "",
        ] {
            assert!(l.set(bad).is_err(), "{bad}");
            assert_eq!(l.describe(), before, "{bad} changed something");
        }
        assert_eq!(l.changes(), 0);
        assert_eq!(
            l.set("samples=40 epoch-ms=20 density=10 share=25").unwrap(),
            "samples=40 windows=2 density=10 share=25 epoch-ms=20"
        );
        assert_eq!(l.density(), 0.01);
        assert_eq!(l.share(), 0.25);
        assert_eq!(
            (l.samples(), l.windows(), l.epoch()),
            (40, 2, Duration::from_millis(20))
        );
        assert_eq!(l.whole_overflow(), 2 * window::WHOLE_OVERFLOW);
        assert_eq!(l.changes(), 1);
    }
}
