//! The paper's Fig. 10: latency histograms of deactivating, then
//! re-activating, 20,000 probes (about 10% straddlers) with each strategy.
//!
//! The TSC may step coarsely, so each sample is a batch of 10 probes of the
//! same class timed together and divided; a straddler's wordpatch toggle
//! (thousands of ticks) is well above the step either way.

use crate::driver::{samples, text, Driver};
use crate::error::Result;
use crate::measure::{quantile, Summary};
use crate::plot::{Figure, Panel, Scale, Series};
use std::fmt::Write as _;

/// One histogram: a strategy, an operation, a class of probes.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Histogram {
    /// Strategy.
    pub strategy: String,
    /// `deactivate` or `activate`.
    pub op: String,
    /// `non-straddlers` or `straddlers`.
    pub class: String,
    /// Ticks per probe of every batch.
    pub samples: Vec<f64>,
    /// Median and p90.
    pub summary: Summary,
    /// 99th percentile.
    pub p99: f64,
    /// Largest batch.
    pub max: f64,
}

/// The figure's data.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Fig10 {
    /// Non-straddling probes toggled.
    pub non_straddlers: usize,
    /// Straddling probes toggled.
    pub straddlers: usize,
    /// Probes per timed batch.
    pub batch: usize,
    /// Every histogram.
    pub histograms: Vec<Histogram>,
}

/// Runs the driver's `fig10` over `probes` probes.
pub fn measure(driver: &Driver, probes: usize) -> Result<Fig10> {
    let lines = driver.run(&["fig10".into(), probes.to_string()])?;
    let mut f = Fig10 {
        non_straddlers: 0,
        straddlers: 0,
        batch: 0,
        histograms: Vec::new(),
    };
    for l in &lines {
        match text(l, "sec") {
            "fig10-set" => {
                f.non_straddlers = l["non_straddlers"].as_u64().unwrap_or(0) as usize;
                f.straddlers = l["straddlers"].as_u64().unwrap_or(0) as usize;
                f.batch = l["batch"].as_u64().unwrap_or(0) as usize;
            }
            "fig10" => {
                let v = samples(l, "ticks");
                f.histograms.push(Histogram {
                    strategy: text(l, "strategy").into(),
                    op: text(l, "op").into(),
                    class: text(l, "class").into(),
                    summary: Summary::of(&v),
                    p99: quantile(&v, 0.99),
                    max: v.iter().copied().fold(f64::NAN, f64::max),
                    samples: v,
                })
            }
            _ => {}
        }
    }
    Ok(f)
}

impl Fig10 {
    /// Summary table as Markdown.
    pub fn markdown(&self) -> String {
        let mut s = format!(
            "{} probes ({} non-straddlers, {} straddlers, {:.1}%), deactivated then re-activated with each strategy; \
             ticks per probe over batches of {}.\n\n",
            self.non_straddlers + self.straddlers,
            self.non_straddlers,
            self.straddlers,
            100.0 * self.straddlers as f64 / (self.non_straddlers + self.straddlers).max(1) as f64,
            self.batch
        );
        s.push_str("| strategy | operation | probes | median | p90 | p99 | max |\n| --- | --- | --- | --- | --- | --- | --- |\n");
        for h in &self.histograms {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {:.0} | {:.0} | {:.0} | {:.0} |",
                h.strategy, h.op, h.class, h.summary.median, h.summary.p90, h.p99, h.max
            );
        }
        s
    }

    /// The histograms: a panel per strategy and operation, the two classes
    /// overlaid, log-scaled ticks.
    pub fn svg(&self) -> String {
        let mut panels = Vec::new();
        let mut keys: Vec<(&str, &str)> = Vec::new();
        for h in &self.histograms {
            if !keys.contains(&(&h.strategy, &h.op)) {
                keys.push((&h.strategy, &h.op));
            }
        }
        for (strategy, op) in keys {
            panels.push(Panel {
                title: format!("{strategy}: {op}"),
                series: self
                    .histograms
                    .iter()
                    .filter(|h| h.strategy == strategy && h.op == op)
                    .map(|h| Series {
                        label: format!("{} (n={})", h.class, h.samples.len()),
                        points: h.samples.iter().filter(|x| **x > 0.0).map(|&x| (x, 0.0)).collect(),
                        dashed: false,
                    })
                    .collect(),
            });
        }
        Figure {
            title: format!(
                "Fig. 10: latency of deactivating then re-activating {} probes",
                self.non_straddlers + self.straddlers
            ),
            x_label: "TSC ticks per probe (log)".into(),
            y_label: "% of batches".into(),
            x_scale: Scale::Log10,
            columns: 2,
            panels,
        }
        .histogram_svg(40)
    }
}
