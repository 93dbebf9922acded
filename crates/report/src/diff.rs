//! Two runs compared: per function, the change in calls, self and
//! inclusive time and the p50/p99 latencies, sorted by impact; and a
//! differential flame graph (inferno's: the second run's stacks, coloured
//! red where they grew and blue where they shrank).
//!
//! Impact is the absolute change of self time, then of inclusive time: a
//! function made slower moves its own self time, while its callers move
//! only their inclusive time, so it comes first.

use crate::{FunctionRow, Range, Report};
use std::collections::BTreeMap;
use std::fmt::Write;

/// One function in two runs (`None` where a run does not have it).
#[derive(Clone, Debug, PartialEq)]
pub struct FunctionDiff {
    /// Its name.
    pub name: String,
    /// Its row in the first run.
    pub before: Option<FunctionRow>,
    /// Its row in the second run.
    pub after: Option<FunctionRow>,
}

impl FunctionDiff {
    fn field(&self, f: impl Fn(&FunctionRow) -> f64) -> (f64, f64) {
        (
            self.before.as_ref().map_or(0.0, &f),
            self.after.as_ref().map_or(0.0, &f),
        )
    }

    /// Self time, before and after (ms).
    pub fn self_ms(&self) -> (f64, f64) {
        self.field(|r| r.self_ms)
    }

    /// Inclusive time, before and after (ms).
    pub fn total_ms(&self) -> (f64, f64) {
        self.field(|r| r.total_ms)
    }

    /// Estimated calls, before and after.
    pub fn calls(&self) -> (f64, f64) {
        self.field(|r| r.calls_estimated)
    }

    /// Whether its latency at a percentile (`pick` chooses the range: the
    /// p50's or the p99's) changed beyond both runs' stated uncertainty:
    /// their 95% ranges do not meet. `None` where a run has no range.
    pub fn latency_moved(&self, pick: impl Fn(&FunctionRow) -> Option<Range>) -> Option<bool> {
        let a = pick(self.before.as_ref()?)?;
        let b = pick(self.after.as_ref()?)?;
        Some(!a.meets(&b))
    }

    /// Whether nothing it reports changed.
    pub fn unchanged(&self) -> bool {
        self.before == self.after
    }
}

/// Every function of either run, the most changed first.
pub fn diff(before: &Report, after: &Report) -> Vec<FunctionDiff> {
    let mut by_name: BTreeMap<&str, FunctionDiff> = BTreeMap::new();
    for (rows, is_after) in [(&before.functions, false), (&after.functions, true)] {
        for r in rows {
            let d = by_name.entry(r.name.as_str()).or_insert_with(|| FunctionDiff {
                name: r.name.clone(),
                before: None,
                after: None,
            });
            let slot = if is_after { &mut d.after } else { &mut d.before };
            *slot = Some(r.clone());
        }
    }
    let mut v: Vec<FunctionDiff> = by_name.into_values().collect();
    let change = |x: (f64, f64)| (x.1 - x.0).abs();
    v.sort_by(|a, b| {
        change(b.self_ms())
            .total_cmp(&change(a.self_ms()))
            .then(change(b.total_ms()).total_cmp(&change(a.total_ms())))
            .then(a.name.cmp(&b.name))
    });
    v
}

fn pct(before: f64, after: f64) -> String {
    if before == after {
        "=".into()
    } else if before == 0.0 {
        "new".into()
    } else {
        format!("{:+.0}%", (after - before) / before * 100.0)
    }
}

/// The comparison as a table, the most changed function first.
pub fn render_diff_text(before: &Report, after: &Report) -> String {
    let rows = diff(before, after);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "fastinst diff: {} (pid {}, {:.3} s) -> {} (pid {}, {:.3} s)",
        before.program,
        before.pid,
        before.wall_ms / 1e3,
        after.program,
        after.pid,
        after.wall_ms / 1e3
    );
    let changed = rows.iter().filter(|d| !d.unchanged()).count();
    if changed == 0 {
        let _ = writeln!(out, "no change: every function reads the same in both runs");
        return out;
    }
    let _ = writeln!(
        out,
        "{changed} of {} functions changed; sorted by the change of self time, then of total time; * after a latency: the runs' 95% ranges of it do not meet (a change beyond what their sampling explains)\n",
        rows.len()
    );
    let _ = writeln!(
        out,
        "{:>12} {:>12} {:>6}  {:>10} {:>10} {:>10}  {:>10} {:>10} {:>10}  {:>9} {:>9}  {:>9} {:>9}  function",
        "calls",
        "calls'",
        "",
        "self ms",
        "self ms'",
        "delta",
        "total ms",
        "total ms'",
        "delta",
        "p50 us",
        "p50 us'",
        "p99 us",
        "p99 us'"
    );
    let us =
        |r: &Option<FunctionRow>, f: fn(&FunctionRow) -> f64| r.as_ref().map_or("-".into(), |r| format!("{:.2}", f(r)));
    // The second run's figure, marked where it moved beyond both runs'
    // ranges.
    let moved = |d: &FunctionDiff, f: fn(&FunctionRow) -> f64, pick: fn(&FunctionRow) -> Option<Range>| {
        let mark = if d.latency_moved(pick) == Some(true) { "*" } else { "" };
        format!("{}{mark}", us(&d.after, f))
    };
    for d in &rows {
        let (c0, c1) = d.calls();
        let (s0, s1) = d.self_ms();
        let (t0, t1) = d.total_ms();
        let name = match (&d.before, &d.after) {
            (None, _) => format!("{} (only after)", d.name),
            (_, None) => format!("{} (only before)", d.name),
            _ => d.name.clone(),
        };
        let _ = writeln!(
            out,
            "{:>12.0} {:>12.0} {:>6}  {:>10.3} {:>10.3} {:>+10.3}  {:>10.3} {:>10.3} {:>+10.3}  {:>9} {:>9}  {:>9} {:>9}  {}",
            c0,
            c1,
            pct(c0, c1),
            s0,
            s1,
            s1 - s0,
            t0,
            t1,
            t1 - t0,
            us(&d.before, |r| r.p50_us),
            moved(d, |r| r.p50_us, |r| r.p50_range),
            us(&d.before, |r| r.p99_us),
            moved(d, |r| r.p99_us, |r| r.p99_range),
            name
        );
    }
    out
}

/// A differential flame graph of the two runs' stacks (inferno): the second
/// run's stacks, red where they grew, blue where they shrank. `Ok(None)`
/// when neither run has stacks.
pub fn render_diff_svg(before: &Report, after: &Report) -> Result<Option<String>, String> {
    let (a, b) = (crate::render_folded(before), crate::render_folded(after));
    if a.is_empty() && b.is_empty() {
        return Ok(None);
    }
    let mut folded = Vec::new();
    inferno::differential::from_readers(Default::default(), a.as_bytes(), b.as_bytes(), &mut folded)
        .map_err(|e| e.to_string())?;
    let folded = String::from_utf8(folded).map_err(|e| e.to_string())?;
    let mut opt = inferno::flamegraph::Options::default();
    opt.title = format!("{} -> {}", before.program, after.program);
    let mut svg = Vec::new();
    inferno::flamegraph::from_lines(&mut opt, folded.lines(), &mut svg).map_err(|e| e.to_string())?;
    String::from_utf8(svg).map(Some).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Stacks;

    fn run(slow: f64) -> Report {
        let mut r = Report {
            program: "app".into(),
            wall_ms: 100.0,
            ..Default::default()
        };
        for (name, calls, total, own) in [
            ("main", 1.0, 90.0, 1.0),
            ("outer", 100.0, 80.0, 10.0),
            ("b", 1000.0, 30.0 + slow, 30.0 + slow),
            ("c", 1000.0, 40.0, 40.0),
        ] {
            r.functions.push(crate::tests::test_row(name, calls, total, own));
        }
        r.stacks = Stacks::from_named([
            (vec!["main", "outer", "b"], 10, 30.0 + slow),
            (vec!["main", "outer", "c"], 10, 40.0),
        ]);
        r
    }

    #[test]
    fn a_run_against_itself_shows_no_change() {
        let r = run(0.0);
        assert!(diff(&r, &r).iter().all(FunctionDiff::unchanged));
        assert!(render_diff_text(&r, &r).contains("no change"));
    }

    #[test]
    fn the_slowed_function_tops_the_list_and_the_flame_graph_shows_it() {
        let (a, b) = (run(0.0), run(25.0));
        let d = diff(&a, &b);
        assert_eq!(d[0].name, "b", "{d:?}");
        assert_eq!(d[0].self_ms(), (30.0, 55.0));
        let text = render_diff_text(&a, &b);
        let first_row = text.lines().nth(4).unwrap();
        assert!(first_row.ends_with(" b") && first_row.contains("+25.000"), "{text}");
        let svg = render_diff_svg(&a, &b).unwrap().unwrap();
        assert!(svg.contains("<svg") && svg.contains(">b<"), "the grown frame is drawn");
    }

    /// A p50 whose two ranges do not meet is marked as moved; one whose
    /// ranges overlap, or a run without ranges, is not.
    #[test]
    fn a_latency_is_marked_moved_only_beyond_both_runs_ranges() {
        let (mut a, mut b) = (run(0.0), run(25.0));
        let set = |r: &mut Report, name: &str, p50: f64, lo: f64, hi: f64| {
            let f = r.functions.iter_mut().find(|f| f.name == name).unwrap();
            f.p50_us = p50;
            f.p50_range = Some(Range { lo, hi: Some(hi) });
        };
        set(&mut a, "b", 10.0, 9.0, 11.0);
        set(&mut b, "b", 14.0, 12.5, 15.5);
        set(&mut a, "c", 10.0, 8.0, 12.0);
        set(&mut b, "c", 11.5, 10.5, 12.5);
        let d = diff(&a, &b);
        let row = |n: &str| d.iter().find(|x| x.name == n).unwrap();
        assert_eq!(row("b").latency_moved(|r| r.p50_range), Some(true));
        assert_eq!(row("c").latency_moved(|r| r.p50_range), Some(false));
        assert_eq!(row("main").latency_moved(|r| r.p50_range), None);
        let text = render_diff_text(&a, &b);
        let line = |n: &str| {
            text.lines()
                .find(|l| l.ends_with(&format!(" {n}")))
                .unwrap()
                .to_string()
        };
        assert!(line("b").contains("14.00*"), "{text}");
        assert!(line("c").contains("11.50 ") && !line("c").contains('*'), "{text}");
    }

    #[test]
    fn a_function_of_one_run_only_is_named_so() {
        let a = run(0.0);
        let mut b = run(0.0);
        b.functions.retain(|f| f.name != "c");
        let text = render_diff_text(&a, &b);
        assert!(text.contains("c (only before)"), "{text}");
    }
}
