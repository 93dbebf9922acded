//! The failure table per wait W and split S (the paper's Fig. 9) as text.
//! Rows can be printed one by one as the sweep finishes each wait.

use crate::sweep::{Sweep, Tally};
use std::fmt::Write as _;

/// The explanation printed under the table.
pub fn legend() -> String {
    format!(
        "cells: failed trials / counted trials, over every executor count; '-' = no counted trial.\n\
         a trial counts when >= {} of its toggles, and >= {:.0}% of them, overlapped executor progress;\n\
         'uncounted' are clean trials below that (the executors did not run while the patcher toggled).",
        stress::MIN_CORUN_TOGGLES,
        stress::MIN_CORUN_RATIO * 100.0
    )
}

/// The header line for these splits.
pub fn header(splits: &[usize]) -> String {
    let mut s = format!("{:>9} |", "W (ticks)");
    for sp in splits {
        let _ = write!(s, " {:^7} |", format!("S={sp}"));
    }
    let _ = write!(s, " {:>11} | {:>6} | {:>9}", "toggles", "co-run", "uncounted");
    s
}

fn cell(t: &Tally) -> String {
    if t.counted == 0 {
        "-".into()
    } else {
        format!("{}/{}", t.failures, t.counted)
    }
}

/// One wait's row.
pub fn row(sweep: &Sweep, wait: u64, splits: &[usize]) -> String {
    let mut s = format!("{wait:>9} |");
    for &sp in splits {
        let _ = write!(s, " {:^7} |", cell(&sweep.at(wait, sp)));
    }
    let r = sweep.row(wait);
    let _ = write!(
        s,
        " {:>11} | {:>5.0}% | {:>9}",
        r.toggles,
        r.corun_ratio() * 100.0,
        r.inconclusive
    );
    if r.failures > 0 {
        s.push_str("  FAIL");
    }
    s
}

/// The whole table, with header and legend.
pub fn render(sweep: &Sweep) -> String {
    let splits = sweep.splits();
    let mut s = header(&splits);
    s.push('\n');
    for w in sweep.waits() {
        s.push_str(&row(sweep, w, &splits));
        s.push('\n');
    }
    s.push_str(&legend());
    s.push('\n');
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sweep::Cell;
    use stress::ConfigResult;

    #[test]
    fn rows_show_failures_over_counted() {
        let mk = |wait, split, failures, counted| Cell {
            wait,
            split,
            executors: 1,
            result: ConfigResult {
                trials: 2,
                counted,
                inconclusive: 2 - counted,
                failures,
                toggles: 1000,
                corun_toggles: 500,
                ..Default::default()
            },
        };
        let s = Sweep {
            cells: vec![mk(0, 1, 1, 1), mk(0, 2, 0, 2), mk(500, 1, 0, 0), mk(500, 2, 0, 2)],
        };
        let t = render(&s);
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].contains("S=1") && lines[0].contains("S=2"));
        assert!(lines[1].contains("1/1") && lines[1].contains("0/2") && lines[1].ends_with("FAIL"));
        assert!(lines[2].contains(" - ") && lines[2].contains("50%"));
    }
}
