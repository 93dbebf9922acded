//! The flame graph's input, without the frames it would not draw.
//!
//! inferno draws a frame only if it is at least `min_width` percent of the
//! whole, but it parses, merges and times every frame of every folded line
//! first; a real program's profile has thousands of paths, of which the
//! flame graph draws a small part, and inferno's parsing was a large share
//! of what the reports cost at exit.
//!
//! [`drawable`] cuts each path before its first frame that inferno
//! would not draw (keeping the root, whose weight counts in the total even
//! when it is not drawn) and merges consecutive paths that become alike.
//! inferno's frames are runs of consecutive lines that share a prefix
//! (`flow` in its `merge.rs`); the widths are computed here the same way,
//! over the same folded names, and with inferno's threshold expression, so
//! every frame it draws spans the same lines with the same weights, starts
//! and ends at the same time, and closes in the same order. A cut line's
//! weight stays where it was, inside its parent's run, so the siblings
//! after it start where they did: the SVG is byte for byte the one the
//! whole folded stacks give (tested, on generated reports and against
//! SQLite's).
//!
//! The cut lines keep their order but no longer sort (`a;b` after
//! `a;b;c`), so they are drawn in the order given: by [`crate::svg`] from
//! their frame numbers, or, for names it leaves to inferno, by inferno as a
//! flame chart, whose only difference is that it takes the lines in the
//! order given (reversed) instead of checking that they sort. Keeping the first narrow frame
//! instead, as this did first, kept them sorted but drew the same graph
//! from 2.2 times as many lines and frames (QuickJS: 2,362 lines and 36,900
//! frames against 1,056 and 15,600).

use crate::{folded_names, folded_weight, Report};
use std::fmt::Write as _;

/// Frames the two paths share from the root, frames compared by `canon`
/// (see [`Cut::canon`]).
fn shared_depth(canon: &[u32], a: &[u32], b: &[u32]) -> usize {
    // An index past the names (a report built by hand) prints as `?`.
    let c = |f: u32| canon.get(f as usize).copied().unwrap_or(u32::MAX);
    a.iter().zip(b).take_while(|(x, y)| c(**x) == c(**y)).count()
}

/// The folded lines that a flame graph with `min_width` (inferno's
/// option, percent of the total) draws, as frame numbers into `folded`.
pub(crate) struct Cut<'a> {
    /// Each name as the folded stacks write it.
    pub(crate) folded: Vec<std::borrow::Cow<'a, str>>,
    /// Each name's number among the names that print alike (the first
    /// such name's): inferno's frames are names as printed.
    pub(crate) canon: Vec<u32>,
    /// The cut lines, in the folded stacks' order: frames, weight.
    pub(crate) lines: Vec<(&'a [u32], u64)>,
}

impl Cut<'_> {
    /// Frames the two paths share from the root.
    pub(crate) fn shared_depth(&self, a: &[u32], b: &[u32]) -> usize {
        shared_depth(&self.canon, a, b)
    }

    /// The lines as folded text, which inferno draws as the cut graph.
    pub(crate) fn text(&self) -> String {
        let mut out = String::new();
        for &(frames, w) in &self.lines {
            for (k, &f) in frames.iter().enumerate() {
                if k > 0 {
                    out.push(';');
                }
                out.push_str(self.folded.get(f as usize).map_or("?", |n| n));
            }
            let _ = writeln!(out, " {w}");
        }
        out
    }
}

/// The folded lines (as [`render_folded`](crate::render_folded)
/// writes them, in `r`'s order) cut to what a flame graph with
/// `min_width` (inferno's option, percent of the total) draws. `r`'s
/// stacks must be in the order their lines sort (inferno's order).
pub(crate) fn drawable(r: &Report, min_width: f64) -> Cut<'_> {
    let st = &r.stacks;
    let folded = folded_names(st);
    // Two frames are one to inferno when their names print alike in the
    // folded stacks (`g h`, `g;h`, `g_h`): each name's number is that of
    // the first name that prints as it does.
    let mut first: std::collections::HashMap<&str, u32> = std::collections::HashMap::new();
    let canon: Vec<u32> = folded
        .iter()
        .enumerate()
        .map(|(i, f)| *first.entry(f.as_ref()).or_insert(i as u32))
        .collect();
    drop(first);
    let lines: Vec<(&[u32], u64)> = st
        .paths
        .iter()
        .map(|s| (&s.frames[..], folded_weight(s)))
        .filter(|&(frames, w)| w > 0 && !frames.is_empty())
        .collect();
    let total: u64 = lines.iter().map(|l| l.1).sum();
    // inferno's expressions (flamegraph/mod.rs), so that the comparison
    // below rounds as its own does.
    let widthpertime_pct = 100.0 / total as f64;
    let minwidth_time = min_width / widthpertime_pct;
    // cut[i]: frames of line i to keep: those above the shallowest frame
    // that is too narrow to draw, or the root alone (a line with no frame
    // would be dropped, and its weight with it).
    let mut cut: Vec<usize> = lines.iter().map(|l| l.0.len()).collect();
    // Open runs, one per depth: (first line, weight before it).
    let mut open: Vec<(usize, u64)> = Vec::new();
    let mut before = 0u64;
    for i in 0..=lines.len() {
        let keep = match (i.checked_sub(1), lines.get(i)) {
            (Some(p), Some(l)) => shared_depth(&canon, lines[p].0, l.0),
            _ => 0,
        };
        while open.len() > keep {
            let depth = open.len() - 1;
            let (first, at) = open.pop().expect("longer than keep");
            if ((before - at) as f64) < minwidth_time {
                for c in &mut cut[first..i] {
                    *c = (*c).min(depth.max(1));
                }
            }
        }
        if let Some(&(frames, w)) = lines.get(i) {
            open.resize(frames.len(), (i, before));
            before += w;
        }
    }
    let mut kept = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let frames = &lines[i].0[..cut[i]];
        let mut w = lines[i].1;
        i += 1;
        while i < lines.len() && cut[i] == frames.len() && shared_depth(&canon, lines[i].0, frames) == frames.len() {
            w += lines[i].1;
            i += 1;
        }
        kept.push((frames, w));
    }
    Cut {
        folded,
        canon,
        lines: kept,
    }
}

/// [`drawable`]'s lines as folded text.
#[cfg(test)]
pub(crate) fn drawable_lines(r: &Report, min_width: f64) -> String {
    drawable(r, min_width).text()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{flame_options, lines_sorted, order_and_merge, render_folded, render_svg};
    use crate::{test_report, Stacks};

    /// inferno on the whole folded stacks, as the reports drew it before.
    fn whole_svg(r: &Report) -> String {
        let folded = render_folded(r);
        let mut opt = flame_options(r);
        opt.no_sort = lines_sorted(&folded);
        let mut out = Vec::new();
        inferno::flamegraph::from_lines(&mut opt, folded.lines(), &mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    /// Random paths over `names`, weights
    /// spread over six orders of magnitude so most frames are too narrow to
    /// draw, ordered and merged as `collect` does.
    fn random_report(names: &[&str], seed: u64, n: usize) -> Report {
        let mut x = seed;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let paths: Vec<(Vec<&str>, u64, f64)> = (0..n)
            .map(|_| {
                let depth = 1 + (next() % 14) as usize;
                // Shallow frames from few names, so paths share prefixes.
                let frames = (0..depth)
                    .map(|d| names[(next() as usize) % (2 + d).min(names.len())])
                    .collect();
                // Mostly light paths: u^3 of the exponent.
                let u = (next() % 1000) as f64 / 1000.0;
                let w = 10f64.powf(8.0 * u * u * u);
                (frames, 1, w / 1e3)
            })
            .collect();
        let mut st = Stacks::from_named(paths);
        order_and_merge(&mut st);
        test_report(st)
    }

    #[test]
    fn the_flame_graph_of_the_drawable_frames_is_the_whole_ones() {
        let names = [
            "main", "run", "f", "g", "h", "k", "parse", "eval", "[...]", "step", "leaf", "m",
        ];
        for seed in 1..=20 {
            let r = random_report(&names, seed * 0x9E37_79B9, 3000);
            let whole = render_folded(&r);
            assert!(lines_sorted(&whole), "seed {seed}: drawn from the cut lines");
            let drawable = drawable_lines(&r, flame_options(&r).min_width);
            assert!(
                drawable.lines().count() * 2 < whole.lines().count(),
                "seed {seed}: {} of {} lines kept",
                drawable.lines().count(),
                whole.lines().count()
            );
            same_svg(&render_svg(&r).unwrap(), &whole_svg(&r), seed);
        }
    }

    /// Names that fold alike (`g h`, `g;h`, `g_h`) are one frame to
    /// inferno, and so to the cut.
    #[test]
    fn names_that_fold_alike_are_one_frame() {
        let names = ["main", "f", "fz", "g h", "g;h", "g_h", "a", "ab"];
        for seed in 1..=20 {
            let r = random_report(&names, seed * 0x2545_F491, 2000);
            assert!(
                lines_sorted(&render_folded(&r)),
                "seed {seed}: drawn from the cut lines"
            );
            same_svg(&render_svg(&r).unwrap(), &whole_svg(&r), seed);
        }
    }

    /// Names that extend one another with a byte below `;` (`f`, `f.cold`,
    /// `f2`): the cut lines, which need not sort, draw the same graph.
    #[test]
    fn names_that_extend_each_other_draw_as_before() {
        let names = ["main", "f", "f.cold", "f2", "g h", "g_h", "a", "a:b"];
        for seed in 1..=20 {
            let r = random_report(&names, seed * 0x2545_F491, 2000);
            assert!(
                lines_sorted(&render_folded(&r)),
                "seed {seed}: drawn from the cut lines"
            );
            same_svg(&render_svg(&r).unwrap(), &whole_svg(&r), seed);
        }
    }

    /// The flame graph written from frame numbers (`svg.rs`) is inferno's
    /// byte for byte, names needing escaping, truncation (by characters),
    /// grey and annotated names included; and it is what was drawn.
    #[test]
    fn the_flame_graph_written_here_is_infernos() {
        let names = [
            "main",
            "run",
            "a<b>",
            "x&y",
            "it's",
            "\"q\"",
            "-",
            "--",
            "std::vector<int>::push_back_a_long_name_cut_short_where_narrow",
            "ünïcödé_long_name_for_the_cut_by_characters_čćž_ünïcödé",
            "module`function",
            "f_[j]",
            "g h",
        ];
        let mut drawn = 0;
        for seed in 1..=20 {
            let r = random_report(&names, seed * 0x5851_F42D, 2500);
            let cut = drawable(&r, flame_options(&r).min_width);
            let mut ours = Vec::new();
            assert!(crate::svg::write(&r, &cut, &mut ours).unwrap(), "seed {seed}");
            let ours = String::from_utf8(ours).unwrap();
            same_svg(&ours, &whole_svg(&r), seed);
            drawn += ours.matches("<g>").count();
        }
        assert!(drawn > 20 * 50, "{drawn} frames drawn");
    }

    /// Names inferno's line parsing would not keep whole are left to it.
    #[test]
    fn names_inferno_would_split_are_left_to_it() {
        // (A space folds to `_`; a tab stays.)
        for odd in ["\tlead", "trail\t", "two\nlines", "cr\r"] {
            let names = ["main", "f", odd];
            let r = random_report(&names, 7, 300);
            let cut = drawable(&r, flame_options(&r).min_width);
            let mut ours = Vec::new();
            let drawn = cut
                .lines
                .iter()
                .any(|l| l.0.iter().any(|&f| &*r.stacks.names[f as usize] == odd));
            assert!(drawn, "{odd:?}");
            assert!(!crate::svg::write(&r, &cut, &mut ours).unwrap(), "{odd:?}");
            assert!(ours.is_empty());
            assert!(render_svg(&r).is_ok(), "{odd:?}");
        }
    }

    /// The files are streamed, not rendered whole first: each must still
    /// be what the in-memory renderings give, and the flame graph must be
    /// drawn from the cut lines only when the streamed lines sorted.
    #[test]
    fn the_files_written_are_the_reports_rendered_in_memory() {
        let names = ["main", "f", "f.cold", "g h", "g_h", "a", "[...]"];
        let dir = std::env::temp_dir().join(format!("fastinst-write-all-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for seed in 1..=6u64 {
            let mut r = random_report(&names, seed * 0x9E37_79B9, 1500);
            if seed % 2 == 0 {
                // Lines out of inferno's order, as an older report may have.
                r.stacks.paths.reverse();
            }
            let folded = render_folded(&r);
            let written = crate::write_all(&r, &dir).unwrap();
            let read = |ext: &str| std::fs::read_to_string(dir.join(format!("fastinst-profile.1.{ext}"))).unwrap();
            assert_eq!(written.files.len(), 5, "seed {seed}");
            assert_eq!(read("txt"), crate::render_text(&r), "seed {seed}");
            let pb = std::fs::read(dir.join("fastinst-profile.1.pb.gz")).unwrap();
            assert_eq!(pb, crate::render_pprof(&r), "seed {seed}");
            assert_eq!(read("folded"), folded, "seed {seed}");
            same_svg(&read("svg"), &render_svg(&r).unwrap(), seed);
            same_svg(&read("svg"), &whole_svg(&r), seed);
            let back: Report = serde_json::from_str(&read("json")).unwrap();
            assert_eq!(back.stacks.len(), r.stacks.len(), "seed {seed}");
            assert_eq!(lines_sorted(&folded), seed % 2 == 1, "seed {seed}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn same_svg(got: &str, want: &str, seed: u64) {
        if got != want {
            let at = got.bytes().zip(want.bytes()).take_while(|(a, b)| a == b).count();
            let lo = at.saturating_sub(300);
            panic!(
                "seed {seed}: the flame graphs differ at byte {at}:\n got {}\nwant {}",
                &got[lo..(at + 300).min(got.len())],
                &want[lo..(at + 300).min(want.len())]
            );
        }
    }
}
