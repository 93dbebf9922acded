//! One timed run of a program: CPU time (user + system, the paper's
//! measure), wall time, exit status and a hash of its standard output.

use crate::error::{EvalError, Result};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

/// What one run did.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Run {
    /// User + system CPU seconds of the program and its threads.
    pub cpu_s: f64,
    /// Wall-clock seconds.
    pub wall_s: f64,
    /// Exit status (`None`: killed by a signal).
    pub code: Option<i32>,
    /// FNV-1a of standard output.
    pub stdout_hash: u64,
    /// Bytes of standard output.
    pub stdout_len: u64,
    /// Standard error, as text.
    pub stderr: String,
}

fn children_cpu_s() -> f64 {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes one rusage into the pointed-to memory, which
    // is valid and large enough; it reads nothing else.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, ru.as_mut_ptr()) };
    assert_eq!(rc, 0, "getrusage(RUSAGE_CHILDREN) cannot fail with valid arguments");
    // SAFETY: zero-initialised and, with rc == 0, filled by the kernel.
    let ru = unsafe { ru.assume_init() };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 * 1e-6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

/// Runs `bin args` with `env` added, standard output to `stdout_to`.
/// Children are measured by the difference in `RUSAGE_CHILDREN`, so runs
/// must not overlap (the harness runs them one at a time).
pub fn run_once(bin: &Path, args: &[String], env: &[(String, String)], stdout_to: &Path) -> Result<Run> {
    let out = std::fs::File::create(stdout_to).map_err(EvalError::io(stdout_to))?;
    let mut cmd = Command::new(bin);
    cmd.args(args).stdout(Stdio::from(out)).stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let before = children_cpu_s();
    let t = Instant::now();
    let o = cmd
        .output()
        .map_err(|e| EvalError::Tool(format!("{}: {e}", bin.display())))?;
    let wall_s = t.elapsed().as_secs_f64();
    let cpu_s = children_cpu_s() - before;
    let bytes = std::fs::read(stdout_to).map_err(EvalError::io(stdout_to))?;
    Ok(Run {
        cpu_s,
        wall_s,
        code: o.status.code(),
        stdout_hash: fnv1a(&bytes),
        stdout_len: bytes.len() as u64,
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    })
}

/// 64-bit FNV-1a.
pub fn fnv1a(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| {
        (h ^ u64::from(x)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The median of `v` (mean of the middle two for even lengths).
pub fn median(v: &[f64]) -> f64 {
    quantile(v, 0.5)
}

/// The `q` quantile of `v` by linear interpolation; NaN when empty.
pub fn quantile(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let x = q * (s.len() - 1) as f64;
    let (lo, hi) = (x.floor() as usize, x.ceil() as usize);
    s[lo] + (s[hi] - s[lo]) * (x - lo as f64)
}

/// Median and 90th percentile of a set of samples (ticks per operation).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Summary {
    /// The median.
    pub median: f64,
    /// The 90th percentile.
    pub p90: f64,
    /// How many samples.
    pub n: usize,
}

impl Summary {
    /// Summarises `v` (NaN quantiles when it is empty).
    pub fn of(v: &[f64]) -> Summary {
        Summary {
            median: median(v),
            p90: quantile(v, 0.9),
            n: v.len(),
        }
    }
}

/// The geometric mean of `v`.
pub fn geomean(v: &[f64]) -> f64 {
    (v.iter().map(|x| x.ln()).sum::<f64>() / v.len() as f64).exp()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statistics() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!((quantile(&[0.0, 10.0], 0.9) - 9.0).abs() < 1e-12);
        assert!((geomean(&[1.0, 4.0]) - 2.0).abs() < 1e-12);
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
    }

    #[test]
    fn a_run_measures_its_child_only() {
        let dir = std::env::temp_dir().join(format!("fastinst-measure-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join("out");
        let args = [
            "-c".to_string(),
            "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; echo done".to_string(),
        ];
        let r = run_once(Path::new("/bin/sh"), &args, &[], &out).unwrap();
        assert_eq!(r.code, Some(0));
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "done\n");
        assert_eq!(r.stdout_hash, fnv1a(b"done\n"));
        assert!(r.cpu_s > 0.0 && r.wall_s > 0.0, "{r:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
