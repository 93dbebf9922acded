//! The flame graph's SVG, written from the cut paths' frame numbers.
//!
//! inferno draws a flame graph from folded text: it parses every line
//! again, splits and compares frames as strings, keeps them in a hash map
//! by name and depth, and writes each number with `{:.N}`, whose exact
//! formatting falls back to Dragon4's big integers for most values: a
//! sizeable part of what the reports cost at exit.
//!
//! The paths are already frame numbers here, in the order inferno takes
//! them, and [`flame::drawable`] already cut them to the frames it
//! draws. [`write`] replays inferno's frame building (`flow` in its
//! `merge.rs`, flame-chart order) on the numbers and writes each frame's
//! element with the expressions of its `from_lines` (`flamegraph/mod.rs`):
//! the same `f64` arithmetic, the same colours (its `namehash` and "hot"
//! palette, ported below), quick-xml's own escaping, and `{:.N}` digits
//! from [`crate::decimal`], which are std's exactly. The header (the
//! script, the styles, the title) is inferno's own, from drawing a
//! one-path graph of the same height.
//!
//! So the file is inferno's, byte for byte: the flame-graph tests compare
//! it with inferno drawing the whole folded stacks, on random reports whose
//! names print alike, extend one another and need escaping. Reports this
//! cannot draw the same way (a name that is empty, has line breaks or
//! surrounding white space, which inferno's line parsing would change; a
//! frame past the names) are left to inferno ([`write`] returns `false`).

use crate::decimal::push_fixed;
use crate::flame::Cut;
use crate::{flame_options, Report};
use std::fmt::Write as _;

/// A frame as inferno's `merge::frames` makes it: a name at a depth (the
/// root, `""`, at 0), spanning `[start, end)` of the weights.
struct Frame {
    /// Index into the names; `ROOT` for the root.
    name: u32,
    depth: usize,
    start: u64,
    end: u64,
}

const ROOT: u32 = u32::MAX;

/// Writes the flame graph of `r`'s paths cut to `cut` (drawn with
/// [`flame_options`], the lines taken in their order) to `out`, or
/// returns `Ok(false)` without writing if inferno must draw it.
pub(crate) fn write(r: &Report, cut: &Cut<'_>, out: &mut impl std::io::Write) -> std::io::Result<bool> {
    let opt = &flame_options(r);
    if !drawable_here(cut, opt) {
        return Ok(false);
    }
    let (mut frames, timemax) = flow(cut);
    if timemax == 0 {
        return Ok(false);
    }
    let widthpertime_pct = 100.0 / timemax as f64;
    let minwidth_time = opt.min_width / widthpertime_pct;
    let mut depthmax = 0;
    frames.retain(|f| {
        let keep = ((f.end - f.start) as f64) >= minwidth_time;
        if keep {
            depthmax = depthmax.max(f.depth);
        }
        keep
    });
    let Some(header) = header(r, depthmax)? else {
        return Ok(false);
    };
    // inferno's default width is private: the header's is the one it used.
    let image_width = header.width as f64;
    let imageheight = header.height;
    let ypad2 = opt.font_size * 2 + 10;

    let mut s = String::with_capacity(header.prefix.len() + frames.len() * 280);
    s.push_str(&header.prefix);
    let _ = write!(s, "{timemax}\">");
    let mut colours: Vec<Option<(u8, u8, u8)>> = vec![None; cut.folded.len()];
    let mut info = String::new();
    let mut text = String::new();
    for f in &frames {
        let name: &str = if f.name == ROOT {
            ""
        } else {
            &cut.folded[f.name as usize]
        };
        let x1_pct = f.start as f64 * widthpertime_pct;
        let x2_pct = f.end as f64 * widthpertime_pct;
        let y1 = imageheight - ypad2 - (f.depth + 1) * opt.frame_height + 1;
        let y2 = imageheight - ypad2 - f.depth * opt.frame_height;
        let samples = ((f.end - f.start) as f64 * opt.factor).round() as usize;
        info.clear();
        if name.is_empty() && f.depth == 0 {
            info.push_str("all (");
            thousands(&mut info, samples as u64);
            let _ = write!(info, " {}, 100%)", opt.count_name);
        } else {
            let pct = 100.0 * samples as f64 / (timemax as f64 * opt.factor);
            info.push_str(deannotate(name));
            info.push_str(" (");
            thousands(&mut info, samples as u64);
            let _ = write!(info, " {}, ", opt.count_name);
            push_fixed(&mut info, pct, 2);
            info.push_str("%)");
        }
        s.push_str("<g><title>");
        s.push_str(&quick_xml::escape::escape(info.as_str()));
        s.push_str("</title><rect x=\"");
        push_fixed(&mut s, x1_pct, 4);
        let _ = write!(s, "%\" y=\"{y1}\" width=\"");
        push_fixed(&mut s, x2_pct - x1_pct, 4);
        let (r, g, b) = match name {
            "--" => (160, 160, 160),
            "-" => (200, 200, 200),
            _ if f.name == ROOT => hot(name),
            _ => *colours[f.name as usize].get_or_insert_with(|| hot(name)),
        };
        let _ = write!(
            s,
            "%\" height=\"{}\" fill=\"rgb({r},{g},{b})\" fg:x=\"{}\" fg:w=\"{}\"/><text x=\"",
            y2 - y1,
            f.start,
            f.end - f.start
        );
        push_fixed(&mut s, x1_pct + 100.0 * 3.0 / image_width, 4);
        s.push_str("%\" y=\"");
        push_fixed(&mut s, 3.0 + (y1 + y2) as f64 / 2.0, 2);
        s.push_str("\">");
        let fitchars =
            ((x2_pct - x1_pct) / (100.0 * opt.font_size as f64 * opt.font_width / image_width)).trunc() as usize;
        if fitchars >= 3 {
            let shown = deannotate(name);
            if shown.len() < fitchars {
                s.push_str(&quick_xml::escape::escape(shown));
            } else {
                text.clear();
                text.extend(shown.chars().take(fitchars - 2));
                text.push_str("..");
                s.push_str(&quick_xml::escape::escape(text.as_str()));
            }
        }
        s.push_str("</text></g>");
    }
    s.push_str("</svg></svg>");
    out.write_all(s.as_bytes())?;
    out.flush()?;
    Ok(true)
}

/// Whether `write` draws `cut` as inferno would: the options are the ones
/// ported here, and every name is one inferno's line parsing keeps whole.
fn drawable_here(cut: &Cut<'_>, opt: &inferno::flamegraph::Options<'_>) -> bool {
    use inferno::flamegraph::color::{BasicPalette, Palette};
    let options_ported = matches!(opt.colors, Palette::Basic(BasicPalette::Hot))
        && opt.hash
        && !opt.color_diffusion
        && opt.palette_map.is_none()
        && opt.direction == inferno::flamegraph::Direction::Straight
        && opt.subtitle.is_none()
        && !opt.pretty_xml
        && !opt.reverse_stack_order
        && opt.base.is_empty();
    let whole = |n: &str| !n.is_empty() && n.trim() == n && !n.contains(['\n', '\r']);
    options_ported
        && cut.lines.iter().all(|(frames, _)| {
            frames
                .iter()
                .all(|&f| cut.folded.get(f as usize).is_some_and(|n| whole(n)))
        })
}

/// inferno's frames for the lines in their order (the folded order, which
/// the reports hand it as a flame chart of the lines reversed, which it
/// reverses back), in the order it makes them (as they end), and the total
/// weight.
fn flow(cut: &Cut<'_>) -> (Vec<Frame>, u64) {
    let mut frames = Vec::new();
    // Open frames by depth: name, start.
    let mut open: Vec<(u32, u64)> = Vec::new();
    let mut time = 0u64;
    let mut last: Option<&[u32]> = None;
    for &(line, w) in &cut.lines {
        // The root is shared by every two lines; none is before the first.
        let shared = last.map_or(0, |l| 1 + cut.shared_depth(l, line));
        close(&mut frames, &mut open, shared, time);
        if open.is_empty() {
            open.push((ROOT, time));
        }
        open.extend(line[open.len() - 1..].iter().map(|&f| (f, time)));
        last = Some(line);
        time += w;
    }
    close(&mut frames, &mut open, 0, time);
    (frames, time)
}

/// Ends the open frames from `depth` on at `time`, shallowest first (as
/// inferno's `flow` does).
fn close(frames: &mut Vec<Frame>, open: &mut Vec<(u32, u64)>, depth: usize, time: u64) {
    for (d, &(name, start)) in open.iter().enumerate().skip(depth) {
        frames.push(Frame {
            name,
            depth: d,
            start,
            end: time,
        });
    }
    open.truncate(depth);
}

/// inferno's SVG up to the frames' total, and the image's size.
struct Header {
    prefix: String,
    width: usize,
    height: usize,
}

/// The header of `r`'s flame graph `depthmax` frames deep: inferno's
/// own, cut from a graph of one path that deep. `None` if its shape is not
/// the one expected.
fn header(r: &Report, depthmax: usize) -> std::io::Result<Option<Header>> {
    if depthmax == 0 {
        return Ok(None);
    }
    let mut one = flame_options(r);
    one.no_sort = true;
    let line = format!("{} 1", vec!["a"; depthmax].join(";"));
    let mut svg = Vec::new();
    inferno::flamegraph::from_lines(&mut one, std::iter::once(line.as_str()), &mut svg)?;
    let svg = String::from_utf8(svg).map_err(std::io::Error::other)?;
    const TOTAL: &str = "total_samples=\"1\">";
    let (Some(at), Some(width), Some(height)) =
        (svg.find(TOTAL), image_size(&svg, "width"), image_size(&svg, "height"))
    else {
        return Ok(None);
    };
    let prefix = svg[..at + TOTAL.len() - "1\">".len()].to_string();
    Ok(Some(Header { prefix, width, height }))
}

/// Attribute `name` (`width`, `height`) of the first `<svg ` element: the
/// image's size as inferno chose it.
fn image_size(svg: &str, name: &str) -> Option<usize> {
    let tag = &svg[svg.find("<svg ")?..];
    let tag = &tag[..tag.find('>')?];
    let key = format!(" {name}=\"");
    let value = &tag[tag.find(&key)? + key.len()..];
    value[..value.find('"')?].parse().ok()
}

/// `n` with thousands separated by `,` (num-format's `Locale::en`).
fn thousands(out: &mut String, n: u64) {
    let digits = n.to_string();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
}

/// inferno's `deannotate`: a Java-style `_[k]` (`kwij`) suffix dropped.
fn deannotate(f: &str) -> &str {
    if f.ends_with(']') {
        if let Some(ai) = f.rfind("_[") {
            if f[ai..].len() == 4 && "kwij".contains(&f[ai + 2..ai + 3]) {
                return &f[..ai];
            }
        }
    }
    f
}

/// inferno's colour for `name` in the "hot" palette with `hash` on
/// (`color::color` and `rgb_components_for_palette`).
fn hot(name: &str) -> (u8, u8, u8) {
    let v1 = namehash(name.bytes());
    let v2 = namehash(name.bytes().rev());
    let v3 = v2;
    (205 + (50f32 * v3) as u8, (230f32 * v1) as u8, (55f32 * v2) as u8)
}

/// inferno's `namehash` (from flamegraph.pl): a weighted hash of the first
/// three bytes, after a `` module` `` prefix if there is one.
fn namehash(mut name: impl Iterator<Item = u8>) -> f32 {
    struct State {
        vector: f32,
        weight: f32,
        max: f32,
        modulo: u8,
    }
    impl State {
        fn new() -> Self {
            State {
                vector: 0.0,
                weight: 1.0,
                max: 1.0,
                modulo: 10,
            }
        }
        fn update(&mut self, c: u8) {
            let i = f32::from(c % self.modulo);
            self.vector += (i / f32::from(self.modulo - 1)) * self.weight;
            self.modulo += 1;
            self.max += self.weight;
            self.weight *= 0.70;
        }
        fn result(&self) -> f32 {
            1.0 - self.vector / self.max
        }
    }
    let mut st = State::new();
    let mut module_name_found = false;
    match name.next() {
        None => return st.result(),
        Some(c) => st.update(c),
    }
    for c in name.by_ref().take(2) {
        if c == b'`' {
            module_name_found = true;
            break;
        }
        st.update(c);
    }
    module_name_found = module_name_found || name.any(|c| c == b'`');
    if module_name_found {
        st = State::new();
        for c in name.take(3) {
            st.update(c);
        }
    }
    st.result()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namehash_is_infernos() {
        // inferno's own test values (color/mod.rs).
        for (name, want) in [
            (
                "org/mozilla/javascript/NativeFunction:.initScriptFunction_[j]",
                0.779_646_04,
            ),
            (
                "]j[_noitcnuFtpircStini.:noitcnuFevitaN/tpircsavaj/allizom/gro",
                0.644_153_1,
            ),
            ("genunix`kmem_cache_free", 0.466_926_34),
            ("eerf_ehcac_memk`xinuneg", 0.840_410_3),
            ("unix`0xfffffffffb8001d6", 0.418_131_17),
            ("6d1008bfffffffffx0`xinu", 0.840_410_3),
            ("un`0xfffffffffb8001d6", 0.418_131_17),
            ("``0xfffffffffb8001d6", 0.418_131_17),
            ("", 1.0),
        ] {
            assert!((namehash(name.bytes()) - want).abs() < f32::EPSILON, "{name}");
        }
    }

    #[test]
    fn thousands_as_num_format_writes_them() {
        for (n, want) in [
            (0, "0"),
            (999, "999"),
            (1000, "1,000"),
            (1234567, "1,234,567"),
            (100000, "100,000"),
        ] {
            let mut s = String::new();
            thousands(&mut s, n);
            assert_eq!(s, want);
        }
    }

    #[test]
    fn deannotate_drops_java_annotations_only() {
        assert_eq!(deannotate("f_[j]"), "f");
        assert_eq!(deannotate("f_[k]"), "f");
        assert_eq!(deannotate("f_[x]"), "f_[x]");
        assert_eq!(deannotate("f[j]"), "f[j]");
        assert_eq!(deannotate("f_[jj]"), "f_[jj]");
    }
}
