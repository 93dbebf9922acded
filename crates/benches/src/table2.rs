//! The paper's Table 2 on this machine: activation, deactivation and
//! invocation cost in TSC ticks for every strategy, straddlers separately,
//! for both providers (`-finstrument-functions` call sites and
//! `-fpatchable-function-entry` sleds), beside a static guard
//! `if (flag[id]) fn[id](id)` measured in the same run.
//!
//! Toggle costs are passes over every probe of a class, divided by the
//! number of probes; invocation costs are batches of 1,000 calls, divided.

use crate::driver::{samples, text, Driver};
use crate::error::Result;
use crate::measure::Summary;
use std::fmt::Write as _;

/// Toggle cost of one class of probes under one strategy.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ToggleRow {
    /// `finstrument`, `sled` or `static-guard`.
    pub provider: String,
    /// The strategy (`guard` for the static guard).
    pub strategy: String,
    /// `non-straddlers`, `straddlers` or `all`.
    pub class: String,
    /// Probes in the class.
    pub probes: usize,
    /// Ticks per deactivation.
    pub deactivate: Summary,
    /// Ticks per activation.
    pub activate: Summary,
}

/// Ticks per call of one case.
#[derive(Clone, Debug, serde::Serialize)]
pub struct InvokeRow {
    /// What was called, in which state.
    pub case: String,
    /// Ticks per call.
    pub ticks: Summary,
}

/// The table.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Table2 {
    /// Passes per class.
    pub reps: usize,
    /// Toggle costs.
    pub toggles: Vec<ToggleRow>,
    /// Invocation costs.
    pub invocations: Vec<InvokeRow>,
    /// Straddle split of the hot `-finstrument-functions` entry site (0: none).
    pub hot_split: i64,
    /// Straddle split of the hot sled (0: none).
    pub sled_split: i64,
}

/// Runs the driver's `table2` with `reps` passes.
pub fn measure(driver: &Driver, reps: usize) -> Result<Table2> {
    let lines = driver.run(&["table2".into(), reps.to_string()])?;
    let mut t = Table2 {
        reps,
        toggles: Vec::new(),
        invocations: Vec::new(),
        hot_split: -1,
        sled_split: -1,
    };
    for l in &lines {
        match text(l, "sec") {
            "toggle" => t.toggles.push(ToggleRow {
                provider: text(l, "provider").into(),
                strategy: text(l, "strategy").into(),
                class: text(l, "class").into(),
                probes: l["n"].as_u64().unwrap_or(0) as usize,
                // The first pass also pays for page permissions and cold
                // caches: it is a warm-up, not a sample.
                deactivate: Summary::of(warm(&samples(l, "deactivate"))),
                activate: Summary::of(warm(&samples(l, "activate"))),
            }),
            "invoke" => t.invocations.push(InvokeRow {
                case: text(l, "case").into(),
                ticks: Summary::of(warm(&samples(l, "ticks"))),
            }),
            "hot" => {
                t.hot_split = l["finstrument_split"].as_i64().unwrap_or(-1);
                t.sled_split = l["sled_split"].as_i64().unwrap_or(-1);
            }
            _ => {}
        }
    }
    Ok(t)
}

fn warm(v: &[f64]) -> &[f64] {
    if v.len() > 1 {
        &v[1..]
    } else {
        v
    }
}

impl Table2 {
    /// The static guard's row.
    fn guard(&self) -> Option<&ToggleRow> {
        self.toggles.iter().find(|r| r.provider == "static-guard")
    }

    /// Ticks per call of `case` (median), if measured.
    pub fn invoke(&self, case: &str) -> Option<f64> {
        self.invocations.iter().find(|r| r.case == case).map(|r| r.ticks.median)
    }

    /// Both parts as Markdown.
    pub fn markdown(&self) -> String {
        let mut s = String::new();
        let g = self.guard();
        let _ = writeln!(
            s,
            "Activation and deactivation, ticks per probe (passes over every probe of a class; median and p90 over {} passes). \
             Ratios are against the static guard's stores (`flag[id] = 1`, `fn[id] = h`), measured in the same run.\n",
            self.reps.saturating_sub(1)
        );
        s.push_str("| provider | strategy | probes | deactivate median | p90 | activate median | p90 | vs guard (deact / act) |\n");
        s.push_str("| --- | --- | --- | --- | --- | --- | --- | --- |\n");
        for r in &self.toggles {
            let ratio = match g {
                Some(g) if r.provider != "static-guard" => format!(
                    "{:.0}x / {:.0}x",
                    r.deactivate.median / g.deactivate.median,
                    r.activate.median / g.activate.median
                ),
                _ => "1x / 1x".into(),
            };
            let _ = writeln!(
                s,
                "| {} | {} | {} {} | {:.1} | {:.1} | {:.1} | {:.1} | {} |",
                r.provider,
                r.strategy,
                r.probes,
                r.class,
                r.deactivate.median,
                r.deactivate.p90,
                r.activate.median,
                r.activate.p90,
                ratio
            );
        }
        let base = self.invoke("plain call");
        let guard_off = self.invoke("static guard, off");
        let _ = writeln!(
            s,
            "\nInvocation, ticks per call of a function whose body is empty (batches of 1,000 calls). \
             Hot sites: the `-finstrument-functions` entry site {}, the sled {}.\n",
            split_words(self.hot_split),
            split_words(self.sled_split)
        );
        s.push_str("| case | median | p90 | vs plain call | vs guard off |\n| --- | --- | --- | --- | --- |\n");
        for r in &self.invocations {
            let rel = |b: Option<f64>| b.map_or("-".into(), |b| format!("{:.2}x", r.ticks.median / b));
            let _ = writeln!(
                s,
                "| {} | {:.1} | {:.1} | {} | {} |",
                r.case,
                r.ticks.median,
                r.ticks.p90,
                rel(base),
                rel(guard_off)
            );
        }
        s
    }
}

fn split_words(split: i64) -> String {
    match split {
        0 => "does not straddle".into(),
        k if k > 0 => format!("straddles at split {k}|{}", 5 - k),
        _ => "was not found".into(),
    }
}
