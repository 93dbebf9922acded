//! The profiler's settings (`FASTINST_PROFILE_*`), read once at start.

use std::time::Duration;

/// Profiler settings, from the environment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    /// Calls timed per function per epoch, about (K >= 2): drawn at
    /// random among its counted calls (`choose`).
    pub samples: u32,
    /// The epoch's mean length.
    pub epoch: Duration,
    /// Signal that writes the reports on demand (0: none).
    pub signal: i32,
    /// What kind of thread the sampler is.
    pub sampler: Sampler,
    /// Whether to sample the copies of a function inlined into other
    /// functions (`FASTINST_INLINED=1`, formerly `FASTINST_PROFILE_INLINED`),
    /// not only its own code.
    ///
    /// Off by default. gcc's `-finstrument-functions` keeps the hooks of
    /// every inlined copy (clang's after-inlining form and sled builds have
    /// none), and sampling them cost more than it showed on Table 3's gcc
    /// builds (measured in `crates/benches/results/history.md`):
    /// - they are mostly helpers a few instructions long, whose sampled
    ///   durations are mostly the hooks' own time;
    /// - they about doubled the samples per second and the handlers' and
    ///   sampler's share of the CPU;
    /// - their call paths filled the per-thread path table, so much of the
    ///   flame graph was cut to `[...];function`.
    ///
    /// Left off, an inlined copy's time is its caller's self time, as in
    /// clang and sled builds of the same program, so the reports of the
    /// three builds name the same functions.
    pub inlined: bool,
    /// Whether to take CPU samples for self time
    /// (`FASTINST_PROFILE_CPU`, default 1; see `cpusample`).
    pub cpu_samples: bool,
    /// Counting windows per windowed function per epoch
    /// (`FASTINST_PROFILE_WINDOWS`, default 2; see `schedule`): more
    /// windows, a tighter call estimate and more counting.
    pub windows: usize,
    /// Counting hooks per 1,000 ticks of program time that the open
    /// windows may run together (`FASTINST_PROFILE_DENSITY`, 1 to 1,000,
    /// default 20; see `schedule`): a counted call runs one hook in a sled
    /// build, two in a `-finstrument-functions` build, and costs a fraction
    /// of one where a sled's stub counts it. The planned windows
    /// that do not fit wait or are dropped, so a lower density counts less,
    /// at less cost, and leaves more of the planned windows unopened.
    pub density: u32,
    /// The share of the threads' CPU time, in percent, that the profiler
    /// holds itself to by timing fewer calls (`FASTINST_PROFILE_SHARE`, 1
    /// to 90, default 20; see `budget`): lower, call estimates less
    /// biased by what the hooks cost beyond their charge, and fewer calls
    /// timed.
    pub share: u32,
}

impl Settings {
    /// The epoch's length over the default's, at least 1: the calls per
    /// epoch that make a function windowed scale with it, so that what
    /// decides is a rate, the cost of counting it whole.
    pub fn epoch_scale(&self) -> f64 {
        (self.epoch.as_secs_f64() / 0.010).max(1.0)
    }
}

/// The sampler thread's kind (`FASTINST_PROFILE_SAMPLER`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sampler {
    /// `clone`, the default: a thread the C library does not know
    /// (`rawthread.rs`), so a single-threaded program keeps glibc's
    /// single-threaded `malloc`. Used unless an on-demand report signal is
    /// set (the sampler writes that report, which allocates) or the
    /// strategy is a word strategy (whose waits may enter libc).
    Clone,
    /// `pthread`: a regular thread, as a debugger expects one.
    Pthread,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            samples: 10,
            epoch: Duration::from_millis(10),
            signal: 0,
            sampler: Sampler::Clone,
            inlined: false,
            windows: 2,
            density: 20,
            share: super::budget::DEFAULT_SHARE,
            cpu_samples: true,
        }
    }
}

impl Settings {
    /// Reads `FASTINST_PROFILE_SAMPLES`, `FASTINST_PROFILE_EPOCH_MS`,
    /// `FASTINST_PROFILE_SIGNAL` (`USR1`, `USR2` or a number) and
    /// `FASTINST_PROFILE_SAMPLER` (`clone`, `pthread`) and
    /// `FASTINST_PROFILE_WINDOWS` (1 to 64), `FASTINST_PROFILE_DENSITY`
    /// (1 to 1,000), `FASTINST_PROFILE_SHARE` (1 to 90) and
    /// `FASTINST_PROFILE_CPU`
    /// (`0`, `1`), and `FASTINST_INLINED` as every tool does
    /// (`FASTINST_INLINED`); an invalid value is reported
    /// and the default kept.
    pub fn from_env() -> Settings {
        let mut s = Settings::default();
        if let Some(v) = crate::env::var("FASTINST_PROFILE_SAMPLES") {
            match v.trim().parse::<u32>() {
                Ok(n) if n >= 2 => s.samples = n,
                _ => crate::log::error(format_args!(
                    "FASTINST_PROFILE_SAMPLES: `{v}` is not a number >= 2; using 10"
                )),
            }
        }
        if let Some(v) = crate::env::var("FASTINST_PROFILE_EPOCH_MS") {
            match v.trim().parse::<f64>() {
                Ok(ms) if ms > 0.0 && ms <= 60_000.0 => s.epoch = Duration::from_secs_f64(ms / 1000.0),
                _ => crate::log::error(format_args!(
                    "FASTINST_PROFILE_EPOCH_MS: `{v}` is not a number of ms in (0, 60000]; using 10"
                )),
            }
        }
        if let Some(v) = crate::env::var("FASTINST_PROFILE_SAMPLER") {
            match v.trim() {
                "clone" => s.sampler = Sampler::Clone,
                "pthread" => s.sampler = Sampler::Pthread,
                _ => crate::log::error(format_args!(
                    "FASTINST_PROFILE_SAMPLER: `{v}` is not clone or pthread; using clone"
                )),
            }
        }
        if let Some(v) = crate::env::var("FASTINST_PROFILE_WINDOWS") {
            match v.trim().parse::<usize>() {
                Ok(n) if (1..=64).contains(&n) => s.windows = n,
                _ => crate::log::error(format_args!(
                    "FASTINST_PROFILE_WINDOWS: `{v}` is not a number in [1, 64]; using 2"
                )),
            }
        }
        if let Some(v) = crate::env::var("FASTINST_PROFILE_DENSITY") {
            match v.trim().parse::<u32>() {
                Ok(n) if (1..=1000).contains(&n) => s.density = n,
                _ => crate::log::error(format_args!(
                    "FASTINST_PROFILE_DENSITY: `{v}` is not a number in [1, 1000]; using 20"
                )),
            }
        }
        if let Some(v) = crate::env::var("FASTINST_PROFILE_SHARE") {
            match v.trim().parse::<u32>() {
                Ok(n) if (1..=90).contains(&n) => s.share = n,
                _ => crate::log::error(format_args!(
                    "FASTINST_PROFILE_SHARE: `{v}` is not a percentage in [1, 90]; using {}",
                    super::budget::DEFAULT_SHARE
                )),
            }
        }
        if let Some(v) = crate::env::var("FASTINST_PROFILE_CPU") {
            match v.trim() {
                "0" => s.cpu_samples = false,
                "1" => s.cpu_samples = true,
                _ => crate::log::error(format_args!("FASTINST_PROFILE_CPU: `{v}` is not 0 or 1; using 1")),
            }
        }
        // The setting every tool shares (its older name included).
        s.inlined = crate::env::inlined_from_env();
        if let Some(v) = crate::env::var("FASTINST_PROFILE_SIGNAL") {
            match v.trim().trim_start_matches("SIG") {
                "" | "none" => {}
                "USR1" => s.signal = libc::SIGUSR1,
                "USR2" => s.signal = libc::SIGUSR2,
                n => match n.parse::<i32>() {
                    Ok(n) if n > 0 && n < 65 => s.signal = n,
                    _ => crate::log::error(format_args!(
                        "FASTINST_PROFILE_SIGNAL: `{v}` is not USR1, USR2 or a signal number; no signal"
                    )),
                },
            }
        }
        s
    }
}
