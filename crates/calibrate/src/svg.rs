//! The failure table as an SVG line plot: failed trials (y) against the wait
//! W (x), one line per split S, like the paper's Fig. 9; with W* and the
//! recommended T_max marked. Hand-written SVG: no plotting dependency.

use crate::sweep::Sweep;
use std::fmt::Write as _;

const W: f64 = 760.0;
const H: f64 = 420.0;
const LEFT: f64 = 60.0;
const RIGHT: f64 = 150.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 50.0;
const COLOURS: [&str; 4] = ["#d62728", "#1f77b4", "#2ca02c", "#9467bd"];

/// `s` escaped for SVG text and attribute values.
pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// Renders the plot. `marks` are labelled vertical lines (W*, T_max) at
/// waits; those beyond the sweep are drawn at its right edge.
pub fn render(sweep: &Sweep, title: &str, marks: &[(&str, u64)]) -> String {
    let waits = sweep.waits();
    let splits = sweep.splits();
    let (w0, w1) = (
        *waits.first().unwrap_or(&0) as f64,
        (*waits.last().unwrap_or(&1) as f64).max(1.0),
    );
    let span = (w1 - w0).max(1.0);
    let ymax = splits
        .iter()
        .flat_map(|&s| waits.iter().map(move |&w| (w, s)))
        .map(|(w, s)| sweep.at(w, s).failures)
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let (pw, ph) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
    let x = |w: f64| LEFT + (w.min(w1) - w0) / span * pw;
    let y = |f: f64| TOP + ph - f / ymax * ph;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="22" text-anchor="middle" font-size="14">{}</text>"#,
        LEFT + pw / 2.0,
        esc(title)
    );
    // Axes and ticks.
    let _ = writeln!(
        s,
        r#"<path d="M{LEFT},{TOP} V{} H{}" stroke="black" fill="none"/>"#,
        TOP + ph,
        LEFT + pw
    );
    let step = (waits.len() / 10).max(1);
    for w in waits.iter().step_by(step) {
        let xx = x(*w as f64);
        let _ = writeln!(
            s,
            r#"<line x1="{xx:.1}" y1="{}" x2="{xx:.1}" y2="{}" stroke="black"/><text x="{xx:.1}" y="{}" text-anchor="middle">{w}</text>"#,
            TOP + ph,
            TOP + ph + 5.0,
            TOP + ph + 18.0
        );
    }
    let ystep = (ymax / 5.0).ceil().max(1.0);
    let mut f = 0.0;
    while f <= ymax {
        let yy = y(f);
        let _ = writeln!(
            s,
            r##"<line x1="{}" y1="{yy:.1}" x2="{LEFT}" y2="{yy:.1}" stroke="black"/><text x="{}" y="{:.1}" text-anchor="end">{f}</text><line x1="{LEFT}" y1="{yy:.1}" x2="{}" y2="{yy:.1}" stroke="#eee"/>"##,
            LEFT - 5.0,
            LEFT - 8.0,
            yy + 4.0,
            LEFT + pw
        );
        f += ystep;
    }
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">wait W (TSC ticks)</text>"#,
        LEFT + pw / 2.0,
        H - 10.0
    );
    let _ = writeln!(
        s,
        r#"<text transform="translate(16,{}) rotate(-90)" text-anchor="middle">failed trials</text>"#,
        TOP + ph / 2.0
    );
    // One line per split; hollow markers where no trial counted.
    for (i, &sp) in splits.iter().enumerate() {
        let c = COLOURS[i % COLOURS.len()];
        let pts: Vec<String> = waits
            .iter()
            .map(|&w| format!("{:.1},{:.1}", x(w as f64), y(sweep.at(w, sp).failures as f64)))
            .collect();
        let _ = writeln!(
            s,
            r#"<polyline points="{}" fill="none" stroke="{c}" stroke-width="1.5"/>"#,
            pts.join(" ")
        );
        for &w in &waits {
            let t = sweep.at(w, sp);
            let fill = if t.counted == 0 { "white" } else { c };
            let _ = writeln!(
                s,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{fill}" stroke="{c}"><title>W={w} S={sp}: {} failed / {} counted, {} uncounted</title></circle>"#,
                x(w as f64),
                y(t.failures as f64),
                t.failures,
                t.counted,
                t.inconclusive
            );
        }
        let ly = TOP + 10.0 + 18.0 * i as f64;
        let lx = LEFT + pw + 15.0;
        let _ = writeln!(
            s,
            r#"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="{c}" stroke-width="2"/><text x="{}" y="{}">S = {sp}</text>"#,
            lx + 20.0,
            lx + 25.0,
            ly + 4.0
        );
    }
    let note_y = TOP + 10.0 + 18.0 * splits.len() as f64 + 10.0;
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{note_y}" font-size="10">hollow: no counted trial</text>"#,
        LEFT + pw + 15.0
    );
    for (label, w) in marks {
        let xx = x(*w as f64);
        let beyond = (*w as f64) > w1;
        let _ = writeln!(
            s,
            r#"<line x1="{xx:.1}" y1="{TOP}" x2="{xx:.1}" y2="{}" stroke="black" stroke-dasharray="4,3"/><text x="{:.1}" y="{}" font-size="11">{}</text>"#,
            TOP + ph,
            xx - 4.0,
            TOP - 4.0,
            esc(&format!("{label} = {w}{}", if beyond { " (beyond)" } else { "" }))
        );
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sweep::Cell;
    use stress::ConfigResult;

    #[test]
    fn one_line_per_split_and_marks() {
        let cells = (0..3)
            .flat_map(|i| {
                (1..=4).map(move |sp| Cell {
                    wait: i * 500,
                    split: sp,
                    executors: 1,
                    result: ConfigResult {
                        trials: 2,
                        counted: 2,
                        failures: u64::from(i == 0),
                        ..Default::default()
                    },
                })
            })
            .collect();
        let svg = render(&Sweep { cells }, "T_max <test>", &[("W*", 500), ("T_max", 2000)]);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<polyline").count(), 4);
        assert!(svg.contains("T_max &lt;test&gt;"));
        assert!(svg.contains("T_max = 2000 (beyond)"));
    }
}
