//! The inclusive-time reference: perf's call-graph samples of the
//! instrumented build with every probe off.
//!
//! The full trace times every call, but each of its durations also holds
//! what the hooks of every call nested in it cost beyond their calibrated
//! charge: a function with many callees reads long there, and the
//! profile, whose durations hold few hooks, was counted wrong against it
//! (`results/accuracy.md`). perf's "children" count of a function is its
//! samples with the function anywhere on the stack, each sample once: its
//! inclusive CPU time, each outermost call once, measured from outside the
//! very binary that is profiled. CPU time is a call's duration only where
//! nothing else runs and nothing blocks, so the harness uses it for
//! single-threaded programs alone.

use crate::aliases::Aliases;
use crate::error::Result;
use std::collections::BTreeMap;
use std::path::Path;

/// perf's sampling rate for call graphs (Hz of CPU time): lower than the
/// self-time runs', as each sample copies a piece of the stack.
pub const HZ: u32 = 4_000;

/// Bytes of stack each sample copies for perf's DWARF unwinding.
const STACK: &str = "dwarf,16384";

/// Samples with each function on the stack, from one recording.
#[derive(Debug, Clone, Default)]
pub struct Children {
    /// Per canonical name ([`Aliases::canonical`]): samples with the
    /// function on the stack.
    pub samples: BTreeMap<String, f64>,
    /// Samples in all.
    pub total: f64,
}

impl Children {
    /// Records the instrumented `bin args` once with `lib` preloaded and
    /// every probe off, with call graphs.
    pub fn record_off(work: &Path, bin: &Path, args: &[String], lib: &Path) -> Result<Children> {
        let text = crate::perf::record_once(
            work,
            bin,
            args,
            &crate::perf::off_env(lib),
            0,
            &["-F", &HZ.to_string(), "--call-graph", STACK],
            &["--children", "--sort", "dso,sym", "-g", "none", "-n"],
        )?;
        Ok(parse(&text, &Aliases::of_program(bin)))
    }

    /// `name`'s inclusive CPU time and its sampling deviation (ms): its
    /// samples at [`HZ`], and their count's square root.
    pub fn ms(&self, name: &str) -> Option<(f64, f64)> {
        let n = *self.samples.get(name)?;
        let ms = |k: f64| k / f64::from(HZ) * 1e3;
        Some((ms(n), ms(n.sqrt())))
    }
}

/// Parses `perf report --children --sort dso,sym -n -g none -q` lines
/// (`  85.55%  0.00%  0  sqlite  [.] main`: children and self percent of
/// all samples, self samples, module, symbol). The samples in all are the
/// self samples summed; fastinst's own library is left out, as it is
/// from the profile.
pub fn parse(text: &str, aliases: &Aliases) -> Children {
    let mut rows = Vec::new();
    let mut total = 0.0;
    for line in text.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        let (Some(children), Some(own)) = (
            w.first().and_then(|c| c.strip_suffix('%')?.parse::<f64>().ok()),
            w.get(2).and_then(|n| n.parse::<f64>().ok()),
        ) else {
            continue;
        };
        total += own;
        if let (Some(dso), Some(&"[.]")) = (w.get(3), w.get(4)) {
            if w.len() > 5 && !dso.starts_with("libfastinst") {
                rows.push((aliases.canonical(&w[5..].join(" ")), children));
            }
        }
    }
    let mut samples = BTreeMap::new();
    for (name, pct) in rows {
        *samples.entry(name).or_insert(0.0) += pct * total / 100.0;
    }
    Children { samples, total }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn children_lines_parse_into_samples_on_the_stack() {
        let text = "    85.00%     0.00%             0  sqlite  [.] main\n    \
                    40.00%    30.00%           300  sqlite  [.] sqlite3BtreeIndexMoveto\n    \
                    70.00%    70.00%           700  [kernel.kallsyms]  [k] finish_task_switch\n    \
                    10.00%     0.00%             0  libfastinst.so  [.] fastinst::start\n";
        let c = parse(text, &Aliases::default());
        assert_eq!(c.total, 1000.0);
        assert!((c.samples["main"] - 850.0).abs() < 1e-9, "{c:?}");
        assert!((c.samples["sqlite3BtreeIndexMoveto"] - 400.0).abs() < 1e-9);
        assert!(!c.samples.contains_key("fastinst::start"));
        assert!(!c.samples.contains_key("finish_task_switch"));
        let (ms, sd) = c.ms("sqlite3BtreeIndexMoveto").unwrap();
        assert!((ms - 100.0).abs() < 1e-9 && (sd - 5.0).abs() < 1e-9, "{ms} {sd}");
        assert_eq!(c.ms("absent"), None);
    }
}
