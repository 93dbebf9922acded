//! Plain SVG plots: histograms and line charts in panels, with axes, ticks
//! and a legend. Nothing but text is produced, so no plotting library (and
//! no font or system dependency) is needed.

use calibrate::svg::esc;
use std::fmt::Write as _;

/// Colours of successive series.
const COLOURS: [&str; 6] = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf"];

/// One series of a panel.
#[derive(Clone, Debug)]
pub struct Series {
    /// Legend text.
    pub label: String,
    /// Points (x, y); for a histogram, the raw samples in `x`.
    pub points: Vec<(f64, f64)>,
    /// Dashed line (a reference level).
    pub dashed: bool,
}

/// One panel: a title, axes and series.
#[derive(Clone, Debug)]
pub struct Panel {
    /// Title above the panel.
    pub title: String,
    /// Series drawn in it.
    pub series: Vec<Series>,
}

/// Axis scale.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scale {
    /// Linear.
    Linear,
    /// Base-10 logarithmic (values must be positive).
    Log10,
}

impl Scale {
    fn map(self, v: f64) -> f64 {
        match self {
            Scale::Linear => v,
            Scale::Log10 => v.max(1e-12).log10(),
        }
    }
}

/// A figure of panels laid out in a grid.
#[derive(Clone, Debug)]
pub struct Figure {
    /// Title at the top.
    pub title: String,
    /// X-axis label.
    pub x_label: String,
    /// Y-axis label.
    pub y_label: String,
    /// X scale.
    pub x_scale: Scale,
    /// Panels per row.
    pub columns: usize,
    /// The panels.
    pub panels: Vec<Panel>,
}

const PW: f64 = 420.0;
const PH: f64 = 260.0;
const ML: f64 = 70.0;
const MT: f64 = 40.0;
const GAP_X: f64 = 100.0;
const GAP_Y: f64 = 90.0;

/// "Nice" tick values covering [lo, hi].
fn ticks(lo: f64, hi: f64, n: usize) -> Vec<f64> {
    if hi.partial_cmp(&lo) != Some(std::cmp::Ordering::Greater) {
        return vec![lo];
    }
    let raw = (hi - lo) / n as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    let mut v = Vec::new();
    let mut t = (lo / step).ceil() * step;
    while t <= hi + step * 1e-9 {
        v.push(t);
        t += step;
    }
    v
}

fn label(v: f64) -> String {
    let trim = |x: f64| {
        let s = format!("{x:.2}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    };
    let a = v.abs();
    if a >= 1e6 {
        format!("{}M", trim(v / 1e6))
    } else if a >= 1e3 {
        format!("{}k", trim(v / 1e3))
    } else {
        trim(v)
    }
}

impl Figure {
    fn frame(&self, rows: usize) -> (f64, f64) {
        let cols = self.columns.max(1).min(self.panels.len().max(1));
        (
            ML + cols as f64 * (PW + GAP_X),
            MT + 30.0 + rows as f64 * (PH + GAP_Y) + 20.0,
        )
    }

    fn begin(&self, rows: usize) -> String {
        let (w, h) = self.frame(rows);
        let mut s = format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w:.0}\" height=\"{h:.0}\" viewBox=\"0 0 {w:.0} {h:.0}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
        );
        let _ = writeln!(
            s,
            "<text x=\"{:.0}\" y=\"24\" font-size=\"16\" text-anchor=\"middle\">{}</text>",
            w / 2.0,
            esc(&self.title)
        );
        s
    }

    fn origin(&self, i: usize) -> (f64, f64) {
        let cols = self.columns.max(1);
        (
            ML + (i % cols) as f64 * (PW + GAP_X),
            MT + 30.0 + (i / cols) as f64 * (PH + GAP_Y),
        )
    }

    /// Axes, ticks and labels of panel `i` for the data ranges given (in
    /// scaled units for x).
    #[allow(clippy::too_many_arguments)]
    fn axes(&self, s: &mut String, i: usize, title: &str, x0: f64, x1: f64, y0: f64, y1: f64) {
        let (ox, oy) = self.origin(i);
        let _ = writeln!(
            s,
            "<rect x=\"{ox:.1}\" y=\"{oy:.1}\" width=\"{PW}\" height=\"{PH}\" fill=\"none\" stroke=\"#444\"/>"
        );
        let _ = writeln!(
            s,
            "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"13\" text-anchor=\"middle\">{}</text>",
            ox + PW / 2.0,
            oy - 8.0,
            esc(title)
        );
        let xt: Vec<f64> = match self.x_scale {
            Scale::Linear => ticks(x0, x1, 6),
            Scale::Log10 => (x0.floor() as i64..=x1.ceil() as i64)
                .map(|e| e as f64)
                .filter(|e| *e >= x0 - 1e-9 && *e <= x1 + 1e-9)
                .collect(),
        };
        for t in xt {
            let px = ox + (t - x0) / (x1 - x0).max(1e-12) * PW;
            let v = match self.x_scale {
                Scale::Linear => t,
                Scale::Log10 => 10f64.powf(t),
            };
            let _ = writeln!(
                s,
                "<line x1=\"{px:.1}\" y1=\"{:.1}\" x2=\"{px:.1}\" y2=\"{:.1}\" stroke=\"#444\"/><text x=\"{px:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
                oy + PH,
                oy + PH + 5.0,
                oy + PH + 18.0,
                label(v)
            );
        }
        for t in ticks(y0, y1, 5) {
            let py = oy + PH - (t - y0) / (y1 - y0).max(1e-12) * PH;
            let _ = writeln!(
                s,
                "<line x1=\"{:.1}\" y1=\"{py:.1}\" x2=\"{ox:.1}\" y2=\"{py:.1}\" stroke=\"#444\"/><line x1=\"{ox:.1}\" y1=\"{py:.1}\" x2=\"{:.1}\" y2=\"{py:.1}\" stroke=\"#eee\"/><text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
                ox - 5.0,
                ox + PW,
                ox - 8.0,
                py + 4.0,
                label(t)
            );
        }
        let _ = writeln!(
            s,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
            ox + PW / 2.0,
            oy + PH + 36.0,
            esc(&self.x_label)
        );
        let _ = writeln!(
            s,
            "<text transform=\"translate({:.1},{:.1}) rotate(-90)\" text-anchor=\"middle\">{}</text>",
            ox - 50.0,
            oy + PH / 2.0,
            esc(&self.y_label)
        );
    }

    fn legend(s: &mut String, ox: f64, oy: f64, series: &[Series]) {
        for (k, se) in series.iter().enumerate() {
            let y = oy + 14.0 + k as f64 * 15.0;
            let c = COLOURS[k % COLOURS.len()];
            let dash = if se.dashed { " stroke-dasharray=\"5,3\"" } else { "" };
            let _ = writeln!(
                s,
                "<line x1=\"{:.1}\" y1=\"{:.1}\" x2=\"{:.1}\" y2=\"{:.1}\" stroke=\"{c}\" stroke-width=\"2\"{dash}/><text x=\"{:.1}\" y=\"{:.1}\">{}</text>",
                ox + PW - 150.0,
                y - 4.0,
                ox + PW - 130.0,
                y - 4.0,
                ox + PW - 125.0,
                y,
                esc(&se.label)
            );
        }
    }

    /// Line chart: each series' points joined in x order.
    pub fn lines_svg(&self) -> String {
        let rows = self.panels.len().div_ceil(self.columns.max(1));
        let mut s = self.begin(rows);
        for (i, p) in self.panels.iter().enumerate() {
            let all: Vec<(f64, f64)> = p
                .series
                .iter()
                .flat_map(|se| se.points.iter().map(|&(x, y)| (self.x_scale.map(x), y)))
                .filter(|(x, y)| x.is_finite() && y.is_finite())
                .collect();
            let x0 = all.iter().map(|p| p.0).fold(f64::INFINITY, f64::min);
            let x1 = all.iter().map(|p| p.0).fold(f64::NEG_INFINITY, f64::max);
            let y1 = all.iter().map(|p| p.1).fold(0.0, f64::max) * 1.08;
            let (x0, x1) = if x0.is_finite() {
                (x0, x1.max(x0 + 1e-9))
            } else {
                (0.0, 1.0)
            };
            let y1 = if y1 > 0.0 { y1 } else { 1.0 };
            self.axes(&mut s, i, &p.title, x0, x1, 0.0, y1);
            let (ox, oy) = self.origin(i);
            for (k, se) in p.series.iter().enumerate() {
                let mut pts: Vec<(f64, f64)> = se
                    .points
                    .iter()
                    .map(|&(x, y)| (self.x_scale.map(x), y))
                    .filter(|(x, y)| x.is_finite() && y.is_finite())
                    .collect();
                pts.sort_by(|a, b| a.0.total_cmp(&b.0));
                let path: Vec<String> = pts
                    .iter()
                    .map(|(x, y)| format!("{:.1},{:.1}", ox + (x - x0) / (x1 - x0) * PW, oy + PH - y / y1 * PH))
                    .collect();
                let c = COLOURS[k % COLOURS.len()];
                let dash = if se.dashed { " stroke-dasharray=\"5,3\"" } else { "" };
                let _ = writeln!(
                    s,
                    "<polyline points=\"{}\" fill=\"none\" stroke=\"{c}\" stroke-width=\"2\"{dash}/>",
                    path.join(" ")
                );
                if !se.dashed {
                    for p in &path {
                        let (x, y) = p.split_once(',').unwrap_or(("0", "0"));
                        let _ = writeln!(s, "<circle cx=\"{x}\" cy=\"{y}\" r=\"3\" fill=\"{c}\"/>");
                    }
                }
            }
            Self::legend(&mut s, ox, oy, &p.series);
        }
        s.push_str("</svg>\n");
        s
    }

    /// Histogram: each series' samples (`x` of its points) counted into
    /// `bins` bins over the panel's range (log-spaced for a log x scale),
    /// drawn as outlined steps, counts as a share of the series' samples.
    pub fn histogram_svg(&self, bins: usize) -> String {
        let rows = self.panels.len().div_ceil(self.columns.max(1));
        let mut s = self.begin(rows);
        for (i, p) in self.panels.iter().enumerate() {
            let xs: Vec<f64> = p
                .series
                .iter()
                .flat_map(|se| se.points.iter().map(|&(x, _)| self.x_scale.map(x)))
                .filter(|x| x.is_finite())
                .collect();
            let lo = xs.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let (lo, hi) = if lo.is_finite() {
                (lo, hi.max(lo + 1e-6))
            } else {
                (0.0, 1.0)
            };
            let width = (hi - lo) / bins as f64;
            let counts: Vec<Vec<f64>> = p
                .series
                .iter()
                .map(|se| {
                    let mut c = vec![0.0; bins];
                    for &(x, _) in &se.points {
                        let b = ((self.x_scale.map(x) - lo) / width).floor() as usize;
                        c[b.min(bins - 1)] += 1.0;
                    }
                    let n = se.points.len().max(1) as f64;
                    c.iter_mut().for_each(|v| *v = *v * 100.0 / n);
                    c
                })
                .collect();
            let y1 = counts.iter().flatten().copied().fold(0.0, f64::max) * 1.08;
            let y1 = if y1 > 0.0 { y1 } else { 1.0 };
            self.axes(&mut s, i, &p.title, lo, hi, 0.0, y1);
            let (ox, oy) = self.origin(i);
            for (k, c) in counts.iter().enumerate() {
                let col = COLOURS[k % COLOURS.len()];
                let mut d = format!("M{ox:.1},{:.1}", oy + PH);
                for (b, v) in c.iter().enumerate() {
                    let x = ox + b as f64 / bins as f64 * PW;
                    let x2 = ox + (b + 1) as f64 / bins as f64 * PW;
                    let y = oy + PH - v / y1 * PH;
                    let _ = write!(d, " L{x:.1},{y:.1} L{x2:.1},{y:.1}");
                }
                let _ = write!(d, " L{:.1},{:.1}", ox + PW, oy + PH);
                let _ = writeln!(
                    s,
                    "<path d=\"{d}\" fill=\"{col}\" fill-opacity=\"0.25\" stroke=\"{col}\" stroke-width=\"1.5\"/>"
                );
            }
            Self::legend(&mut s, ox, oy, &p.series);
        }
        s.push_str("</svg>\n");
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fig(scale: Scale) -> Figure {
        Figure {
            title: "t <1>".into(),
            x_label: "x".into(),
            y_label: "y".into(),
            x_scale: scale,
            columns: 2,
            panels: vec![
                Panel {
                    title: "a".into(),
                    series: vec![Series {
                        label: "s".into(),
                        points: vec![(1000.0, 2.0), (10.0, 1.0), (100.0, 3.0)],
                        dashed: false,
                    }],
                },
                Panel {
                    title: "b".into(),
                    series: vec![],
                },
            ],
        }
    }

    #[test]
    fn line_chart_is_wellformed_svg_with_every_point() {
        let s = fig(Scale::Log10).lines_svg();
        assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"));
        assert!(s.contains("t &lt;1&gt;"), "titles are escaped");
        assert_eq!(s.matches("<circle").count(), 3);
        // Log ticks at 10, 100, 1000.
        for t in [">10<", ">100<", ">1k<"] {
            assert!(s.contains(t), "{t}");
        }
        assert_eq!(s.matches("<svg").count(), s.matches("</svg>").count());
    }

    #[test]
    fn histogram_bins_every_sample() {
        let mut f = fig(Scale::Linear);
        f.panels[0].series[0].points = (0..100).map(|i| (i as f64, 0.0)).collect();
        let s = f.histogram_svg(10);
        // Ten equal bins of 10% each: every step sits at the same height.
        assert_eq!(s.matches("<path").count(), 1);
        assert!(s.contains("</svg>"));
    }

    #[test]
    fn nice_ticks() {
        assert_eq!(ticks(0.0, 10.0, 5), vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
        assert_eq!(label(2_500_000.0), "2.5M");
        assert_eq!(label(25_000.0), "25k");
        assert_eq!(label(1e6), "1M");
        assert_eq!(label(0.5), "0.5");
    }
}
