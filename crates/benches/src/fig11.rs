//! The paper's Fig. 11–13: calls per second through one hot probe with 1 to
//! N executor threads while one more thread toggles it at 1 kHz to 1 MHz,
//! activate↔activate (handler a ↔ handler b) and activate↔deactivate, with
//! the balance: the ratio of the calls observed in the two states.
//!
//! In fastinst, re-activating an active probe with another handler is a
//! data store (the site already calls the hook), so activate↔activate
//! toggles never touch code; activate↔deactivate patches the site every
//! time. A toggler that cannot keep its rate (oversubscribed CPUs) skips
//! ahead rather than bursting; the achieved rate is reported.
//!
//! The balance of activate↔deactivate is not 1 even for a perfectly fair
//! toggler: an inactive call is cheaper, so more of them fit in the same
//! time. The expected balance, the ratio of the always-off and always-on
//! call rates measured in the same run, is given beside it.

use crate::driver::{text, Driver};
use crate::error::{EvalError, Result};
use crate::plot::{Figure, Panel, Scale, Series};
use std::fmt::Write as _;

/// The toggle rates, Hz.
pub const RATES: [f64; 4] = [1e3, 1e4, 1e5, 1e6];
/// The strategies.
pub const STRATEGIES: [&str; 4] = ["flip", "paper", "word-sync", "word-async"];

/// One run.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Point {
    /// Strategy.
    pub strategy: String,
    /// `aa`, `ad`, `on` (always active, no toggler) or `off`.
    pub mode: String,
    /// Toggle rate asked for (0: no toggler).
    pub rate_hz: f64,
    /// Executor threads.
    pub threads: usize,
    /// Calls per second, all executors together.
    pub calls_per_s: f64,
    /// Toggles per second achieved.
    pub toggles_per_s: f64,
    /// Calls seen by handler a.
    pub a: u64,
    /// Calls seen by handler b (`aa`) or made while inactive (`ad`).
    pub b: u64,
    /// max(a, b) / min(a, b).
    pub balance: f64,
}

/// The figure's data.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Fig11 {
    /// Milliseconds per run.
    pub ms: u64,
    /// Runs per point (the median one is shown).
    pub repeats: usize,
    /// CPUs online.
    pub cpus: usize,
    /// Every run.
    pub points: Vec<Point>,
}

fn one(driver: &Driver, strategy: &str, mode: &str, rate: f64, threads: usize, ms: u64) -> Result<Point> {
    let args: Vec<String> = vec![
        "fig11".into(),
        strategy.into(),
        mode.into(),
        format!("{rate:.0}"),
        threads.to_string(),
        ms.to_string(),
    ];
    let lines = driver.run(&args)?;
    let l = lines
        .iter()
        .find(|l| text(l, "sec") == "fig11")
        .ok_or_else(|| EvalError::Tool(format!("driver {}: no result line", args.join(" "))))?;
    let f = |k: &str| l[k].as_f64().unwrap_or(0.0);
    let secs = f("seconds").max(1e-9);
    let calls = f("calls");
    let a = f("a") as u64;
    let b = if mode == "ad" {
        (calls as u64).saturating_sub(a)
    } else {
        f("b") as u64
    };
    let (hi, lo) = (a.max(b) as f64, a.min(b) as f64);
    Ok(Point {
        strategy: strategy.into(),
        mode: mode.into(),
        rate_hz: f("rate_hz"),
        threads,
        calls_per_s: calls / secs,
        toggles_per_s: f("toggles") / secs,
        a,
        b,
        balance: if lo > 0.0 { hi / lo } else { f64::INFINITY },
    })
}

/// The run of median call rate among `repeats` runs of one point (a
/// shared machine's hiccup in one run must not make a point).
fn median_of(
    driver: &Driver,
    strategy: &str,
    mode: &str,
    rate: f64,
    threads: usize,
    ms: u64,
    repeats: usize,
) -> Result<Point> {
    let mut runs = (0..repeats.max(1))
        .map(|_| one(driver, strategy, mode, rate, threads, ms))
        .collect::<Result<Vec<_>>>()?;
    runs.sort_by(|a, b| a.calls_per_s.total_cmp(&b.calls_per_s));
    Ok(runs.swap_remove(runs.len() / 2))
}

/// Runs every strategy, mode, rate and thread count, `repeats` runs of
/// `ms` each (the median run is kept), with 1..=`max_threads` executors,
/// plus the untoggled baselines.
pub fn measure(driver: &Driver, ms: u64, repeats: usize, max_threads: usize) -> Result<Fig11> {
    let mut points = Vec::new();
    for threads in 1..=max_threads {
        for mode in ["on", "off"] {
            points.push(median_of(driver, "flip", mode, 0.0, threads, ms, repeats)?);
        }
        for s in STRATEGIES {
            for mode in ["aa", "ad"] {
                for r in RATES {
                    points.push(median_of(driver, s, mode, r, threads, ms, repeats)?);
                }
            }
        }
    }
    Ok(Fig11 {
        ms,
        repeats: repeats.max(1),
        cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        points,
    })
}

impl Fig11 {
    fn baseline(&self, mode: &str, threads: usize) -> Option<f64> {
        self.points
            .iter()
            .find(|p| p.mode == mode && p.threads == threads)
            .map(|p| p.calls_per_s)
    }

    /// The table as Markdown.
    pub fn markdown(&self) -> String {
        let mut s = format!(
            "Median of {} run(s) of {} ms per point, on {} CPUs (the toggler is one more thread). Calls/s in millions; \
             balance = calls in the busier state / calls in the other.\n\n",
            self.repeats, self.ms, self.cpus
        );
        let threads: Vec<usize> = {
            let mut t: Vec<usize> = self.points.iter().map(|p| p.threads).collect();
            t.dedup();
            t
        };
        s.push_str(
            "| executors | always on (M calls/s) | always off | expected ad balance |\n| --- | --- | --- | --- |\n",
        );
        for &t in &threads {
            let (on, off) = (self.baseline("on", t), self.baseline("off", t));
            let _ = writeln!(
                s,
                "| {t} | {:.1} | {:.1} | {:.2} |",
                on.unwrap_or(f64::NAN) / 1e6,
                off.unwrap_or(f64::NAN) / 1e6,
                off.zip(on).map_or(f64::NAN, |(a, b)| a / b)
            );
        }
        s.push_str("\n| strategy | mode | executors |");
        for r in RATES {
            let _ = write!(s, " {} calls/s (toggles/s, balance) |", hz(r));
        }
        s.push_str("\n| --- | --- | --- |");
        s.push_str(&" --- |".repeat(RATES.len()));
        s.push('\n');
        for strategy in STRATEGIES {
            for mode in ["aa", "ad"] {
                for &t in &threads {
                    let _ = write!(s, "| {strategy} | {} | {t} |", mode_name(mode));
                    for r in RATES {
                        match self
                            .points
                            .iter()
                            .find(|p| p.strategy == strategy && p.mode == mode && p.threads == t && p.rate_hz == r)
                        {
                            Some(p) => {
                                let _ = write!(
                                    s,
                                    " {:.1}M ({}, {:.2}) |",
                                    p.calls_per_s / 1e6,
                                    hz(p.toggles_per_s),
                                    p.balance
                                );
                            }
                            None => s.push_str(" - |"),
                        }
                    }
                    s.push('\n');
                }
            }
        }
        s
    }

    /// Calls/s against the toggle rate: a panel per strategy, a line per
    /// executor count, dashed always-on/off levels for one executor.
    pub fn svg(&self, mode: &str) -> String {
        let mut threads: Vec<usize> = self.points.iter().map(|p| p.threads).collect();
        threads.dedup();
        let panels = STRATEGIES
            .iter()
            .map(|&strategy| {
                let mut series: Vec<Series> = threads
                    .iter()
                    .map(|&t| Series {
                        label: format!("{t} executor{}", if t == 1 { "" } else { "s" }),
                        points: self
                            .points
                            .iter()
                            .filter(|p| p.strategy == strategy && p.mode == mode && p.threads == t)
                            .map(|p| (p.rate_hz, p.calls_per_s / 1e6))
                            .collect(),
                        dashed: false,
                    })
                    .collect();
                for base in ["on", "off"] {
                    if let Some(v) = self.baseline(base, 1) {
                        series.push(Series {
                            label: format!("always {base}, 1 executor"),
                            points: vec![(RATES[0], v / 1e6), (RATES[RATES.len() - 1], v / 1e6)],
                            dashed: true,
                        });
                    }
                }
                Panel {
                    title: strategy.to_string(),
                    series,
                }
            })
            .collect();
        Figure {
            title: format!("Fig. 11-13: calls/s through one hot probe toggled {}", mode_name(mode)),
            x_label: "toggles per second asked (log)".into(),
            y_label: "million calls per second".into(),
            x_scale: Scale::Log10,
            columns: 2,
            panels,
        }
        .lines_svg()
    }
}

fn mode_name(mode: &str) -> &'static str {
    match mode {
        "aa" => "activate<->activate",
        "ad" => "activate<->deactivate",
        "on" => "always on",
        _ => "always off",
    }
}

fn hz(r: f64) -> String {
    if r >= 1e6 {
        format!("{:.1} MHz", r / 1e6)
    } else if r >= 1e3 {
        format!("{:.0} kHz", r / 1e3)
    } else {
        format!("{r:.0} Hz")
    }
}
