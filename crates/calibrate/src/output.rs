//! The machine config a calibration writes: the recommendation wordpatch
//! reads (`tmax_ticks`, `wait`) and, beside it, the machine and the evidence,
//! so a reader can judge the numbers and tell a stale config.

use crate::machine::Machine;
use crate::plan::Plan;
use crate::recommend::{Recommendation, WaitCosts};
use crate::sweep::{Sweep, Tally};
use std::path::{Path, PathBuf};
use wordpatch::{MachineConfig, Wait};

/// Where a calibration writes when not told (`--out`): env
/// `FASTINST_CONFIG`, else `$XDG_CONFIG_HOME/fastinst/machine.toml`, else
/// `~/.config/fastinst/machine.toml` — the paths wordpatch reads first. A
/// system-wide install passes `--out /etc/fastinst/machine.toml`.
pub fn default_out_path() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("FASTINST_CONFIG") {
        return Ok(PathBuf::from(p));
    }
    std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))
        .map(|d| d.join("fastinst").join("machine.toml"))
        .ok_or_else(|| "neither FASTINST_CONFIG, XDG_CONFIG_HOME nor HOME is set: pass --out PATH".to_string())
}

fn quoted(s: &str) -> String {
    // The config reader keeps values verbatim and has no escapes.
    format!("\"{}\"", s.replace(['"', '\\'], "'").replace('\n', " "))
}

fn list<T: ToString>(v: &[T]) -> String {
    quoted(&v.iter().map(T::to_string).collect::<Vec<_>>().join(","))
}

/// Everything a calibration found, as a config.
pub struct Findings<'a> {
    /// The machine.
    pub machine: &'a Machine,
    /// The plan run.
    pub plan: &'a Plan,
    /// The sweep.
    pub sweep: &'a Sweep,
    /// The verification at the candidate T_max, if run.
    pub verify: Option<&'a Tally>,
    /// Measured costs, if measured.
    pub costs: Option<&'a WaitCosts>,
    /// The decision.
    pub rec: &'a Recommendation,
}

/// Builds the config: `tmax_ticks` only for a T_max that passed, `wait`
/// always (`"synccore"` when nothing else is safe and the kernel has it).
pub fn config(f: &Findings<'_>) -> MachineConfig {
    let all = f.sweep.tally(|_| true);
    let mut extra: Vec<(String, String)> = vec![
        ("cpu_model".into(), quoted(&f.machine.cpu_model)),
        ("cores".into(), f.machine.cores.to_string()),
        ("kernel".into(), quoted(&f.machine.kernel)),
        ("date".into(), quoted(&f.machine.date)),
        ("tsc_mhz".into(), format!("{:.1}", f.machine.tsc_mhz)),
        (
            "calibration".into(),
            quoted(if f.plan.quick { "quick" } else { "full" }),
        ),
        ("waits_tested".into(), list(&f.plan.waits)),
        ("splits".into(), list(&f.plan.splits)),
        ("executors".into(), list(&f.plan.executors)),
        ("trials".into(), all.trials.to_string()),
        ("counted_trials".into(), all.counted.to_string()),
        ("uncounted_trials".into(), all.inconclusive.to_string()),
        ("failed_trials".into(), all.failures.to_string()),
        ("toggles".into(), all.toggles.to_string()),
        ("corun_ratio".into(), format!("{:.3}", all.corun_ratio())),
        ("min_corun_toggles".into(), stress::MIN_CORUN_TOGGLES.to_string()),
        ("min_corun_ratio".into(), stress::MIN_CORUN_RATIO.to_string()),
        (
            "min_clean_wait".into(),
            match &f.rec.min_clean_wait {
                Ok(w) => w.to_string(),
                Err(_) => quoted("none"),
            },
        ),
        ("margin".into(), f.plan.margin.to_string()),
    ];
    if let Some(v) = f.verify {
        extra.push(("verify_toggles".into(), v.toggles.to_string()));
        extra.push(("verify_counted_trials".into(), v.counted.to_string()));
        extra.push(("verify_failed_trials".into(), v.failures.to_string()));
    }
    if let Some(c) = f.costs {
        if let (Some(i), Some(b)) = (c.synccore_idle, c.synccore_busy) {
            extra.push(("synccore_patch_ticks_idle".into(), format!("{i:.0}")));
            extra.push(("synccore_patch_ticks_busy".into(), format!("{b:.0}")));
        }
        extra.push(("tmax_patch_ticks_at".into(), c.tmax_ticks.to_string()));
        extra.push(("tmax_patch_ticks_idle".into(), format!("{:.0}", c.tmax_idle)));
        extra.push(("tmax_patch_ticks_busy".into(), format!("{:.0}", c.tmax_busy)));
    }
    extra.push(("reasons".into(), quoted(&f.rec.reasons.join("; "))));
    MachineConfig {
        tmax_ticks: f.rec.tmax,
        wait: f.rec.wait.map(|w| match w {
            Wait::SyncCore => "synccore".to_string(),
            Wait::Tmax(_) => "tmax".to_string(),
        }),
        extra,
    }
}

/// Writes the config, creating its directory; the error names the path.
pub fn write(cfg: &MachineConfig, path: &Path) -> Result<(), String> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    // Write then rename, so a reader never sees half a config.
    let tmp = path.with_extension("toml.tmp");
    std::fs::write(&tmp, cfg.render()).map_err(|e| format!("cannot write {}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path).map_err(|e| format!("cannot rename {} to {}: {e}", tmp.display(), path.display()))
}
