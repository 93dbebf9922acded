//! The facts about the machine that a calibration is valid for: a config
//! copied to different hardware, or left from before a kernel upgrade, is
//! recognisable as such.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// What the config records about the machine.
#[derive(Clone, Debug, PartialEq)]
pub struct Machine {
    /// `model name` from `/proc/cpuinfo`.
    pub cpu_model: String,
    /// CPUs this process may run on.
    pub cores: usize,
    /// `uname -r`.
    pub kernel: String,
    /// UTC date of the run, `YYYY-MM-DD`.
    pub date: String,
    /// TSC ticks per microsecond, measured (converts ticks to time).
    pub tsc_mhz: f64,
}

impl Machine {
    /// Reads the facts; every part degrades to "unknown" rather than failing.
    pub fn detect() -> Machine {
        Machine {
            cpu_model: cpu_model().unwrap_or_else(|| "unknown".into()),
            cores: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            kernel: kernel().unwrap_or_else(|| "unknown".into()),
            date: utc_date(SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default()),
            tsc_mhz: tsc_mhz(),
        }
    }
}

fn cpu_model() -> Option<String> {
    let text = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    text.lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
}

fn kernel() -> Option<String> {
    // SAFETY: uname fills the zeroed struct it is given.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to a utsname.
    if unsafe { libc::uname(&mut u) } != 0 {
        return None;
    }
    // SAFETY: uname NUL-terminates `release` within the array.
    let r = unsafe { std::ffi::CStr::from_ptr(u.release.as_ptr()) };
    Some(r.to_string_lossy().into_owned())
}

fn tsc_mhz() -> f64 {
    let t0 = Instant::now();
    let c0 = wordpatch::tsc::now_ordered();
    while t0.elapsed() < Duration::from_millis(20) {
        std::hint::spin_loop();
    }
    let c1 = wordpatch::tsc::now_ordered();
    let us = t0.elapsed().as_secs_f64() * 1e6;
    ((c1 - c0) as f64 / us * 10.0).round() / 10.0
}

/// `YYYY-MM-DD` of a time since the Unix epoch (proleptic Gregorian, UTC).
pub fn utc_date(since_epoch: Duration) -> String {
    // Howard Hinnant's days-to-civil algorithm.
    let z = (since_epoch.as_secs() / 86_400) as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates() {
        assert_eq!(utc_date(Duration::ZERO), "1970-01-01");
        assert_eq!(utc_date(Duration::from_secs(951_782_400)), "2000-02-29");
        assert_eq!(utc_date(Duration::from_secs(1_795_219_200)), "2026-11-21");
    }

    #[test]
    fn detects_something() {
        let m = Machine::detect();
        assert!(m.cores >= 1);
        assert!(m.tsc_mhz > 10.0, "{}", m.tsc_mhz);
        assert_ne!(m.kernel, "unknown");
    }
}
