//! `fastinst report`: a saved JSON profile rendered again.

use crate::args::{Args, Item};
use crate::error::{CliError, Result};
use fastinst_report::{self as report, Report, SCHEMA, SCHEMAS_READ};
use std::path::{Path, PathBuf};

/// Usage text.
pub const USAGE: &str = "\
usage: fastinst report [options] FILE.json
       fastinst report --diff [--svg PATH] [-o PATH] BEFORE.json AFTER.json

Reads a profile saved by the profiler (fastinst-profile.<pid>.json, schema
fastinst-profile/4, or /3, /2 and /1 from older versions) and renders it again:
the text table (default), folded stacks, the flame graph, pprof, or the JSON
itself. With --diff, compares two profiles: per function the change in
calls, self and total time and p50/p99, the most changed first (by self
time, then total time); --svg then writes a differential flame graph (the
second run's stacks, red where they grew, blue where they shrank).

options:
  --format F        what to print: text (default), folded, svg, json,
                    speedscope (JSON for speedscope.app), or pprof
                    (gzipped profile.proto for `go tool pprof` and the
                    backends that ingest pprof; needs -o)
  -o, --output PATH write it to PATH instead of stdout
  --svg PATH        also write the flame graph to PATH
  --diff            compare two profiles (see above)
  -h, --help        this text
";

/// What to render.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// The table sorted by time.
    Text,
    /// `a;b;c weight` lines.
    Folded,
    /// The flame graph.
    Svg,
    /// The JSON, pretty-printed.
    Json,
    /// Gzipped `profile.proto`.
    Pprof,
    /// speedscope's JSON.
    Speedscope,
}

/// A parsed `fastinst report`.
#[derive(Debug, PartialEq)]
pub struct ReportArgs {
    /// The JSON report.
    pub file: PathBuf,
    /// `--format`.
    pub format: Format,
    /// `--output`.
    pub output: Option<PathBuf>,
    /// `--svg`.
    pub svg: Option<PathBuf>,
    /// `--diff`: the first profile, compared with [`ReportArgs::file`].
    pub before: Option<PathBuf>,
}

/// Parses the arguments of `fastinst report`; `None` for `--help`.
pub fn parse(argv: &[String]) -> Result<Option<ReportArgs>> {
    let mut a = Args::new("report", argv);
    let (mut file, mut format, mut output, mut svg) = (None, Format::Text, None, None);
    let (mut diff, mut files) = (false, Vec::new());
    while let Some(item) = a.next_item() {
        match item {
            Item::Opt("-h" | "--help", _) => return Ok(None),
            Item::Opt(n @ "--format", i) => {
                format = match a.value(n, i)? {
                    "text" => Format::Text,
                    "folded" => Format::Folded,
                    "svg" => Format::Svg,
                    "json" => Format::Json,
                    "pprof" => Format::Pprof,
                    "speedscope" => Format::Speedscope,
                    other => {
                        return Err(a.usage(format!(
                            "{n}: `{other}` is not one of text, folded, svg, json, speedscope, pprof"
                        )))
                    }
                }
            }
            Item::Opt(n @ ("-o" | "--output"), i) => output = Some(PathBuf::from(a.value(n, i)?)),
            Item::Opt(n @ "--svg", i) => svg = Some(PathBuf::from(a.value(n, i)?)),
            Item::Opt("--diff", None) => diff = true,
            Item::Opt(other, _) => return Err(a.unknown(other)),
            Item::Positional(p) => files.push(PathBuf::from(p)),
            Item::EndOfOptions => files.extend(a.remaining().iter().map(PathBuf::from)),
        }
    }
    let mut before = None;
    if diff {
        if files.len() != 2 {
            return Err(a.usage("--diff compares two profiles: BEFORE.json AFTER.json"));
        }
        if format != Format::Text {
            return Err(a.usage("--diff writes a table (and --svg a flame graph), not --format"));
        }
        file = files.pop();
        before = files.pop();
    } else {
        for p in &files {
            a.one_file(&mut file, &p.to_string_lossy(), "report")?;
        }
    }
    let file = file.ok_or_else(|| a.usage("no report file given (fastinst report FILE.json)"))?;
    if format == Format::Pprof && output.is_none() {
        return Err(a.usage("--format pprof is binary: give the file with -o FILE.pb.gz"));
    }
    Ok(Some(ReportArgs {
        file,
        format,
        output,
        svg,
        before,
    }))
}

/// Reads and checks a saved report.
pub fn load(path: &Path) -> Result<Report> {
    let text = std::fs::read_to_string(path).map_err(CliError::io(path))?;
    let bad = |problem: String| CliError::BadFile {
        path: path.into(),
        problem,
    };
    let value: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(format!("not JSON: {e}")))?;
    let schema = match value.get("schema").and_then(|s| s.as_str()) {
        Some(s) if SCHEMAS_READ.contains(&s) => s.to_string(),
        Some(other) => {
            return Err(bad(format!(
                "schema `{other}`; this fastinst reads `{}`",
                SCHEMAS_READ.join("` and `")
            )))
        }
        None => return Err(bad(format!("not a fastinst profile (no `schema`: `{SCHEMA}` field)"))),
    };
    serde_json::from_value(value).map_err(|e| bad(format!("a {schema} report with a bad field: {e}")))
}

/// Renders `r` as `format`: text, except for pprof's gzipped bytes.
pub fn render(r: &Report, format: Format, path: &Path) -> Result<Vec<u8>> {
    Ok(match format {
        Format::Text => report::render_text(r).into_bytes(),
        Format::Folded => report::render_folded(r).into_bytes(),
        Format::Svg => report::render_svg(r)
            .map_err(|problem| CliError::BadFile {
                path: path.into(),
                problem: format!("cannot draw the flame graph: {problem}"),
            })?
            .into_bytes(),
        Format::Json => (serde_json::to_string_pretty(r).expect("a Report always serialises") + "\n").into_bytes(),
        Format::Pprof => report::render_pprof(r),
        Format::Speedscope => report::render_speedscope(r).into_bytes(),
    })
}

/// Runs `fastinst report`.
pub fn run(a: &ReportArgs) -> Result<()> {
    if let Some(before) = &a.before {
        return run_diff(before, a);
    }
    let r = crate::progress::step(&format!("reading {}", a.file.display()), || load(&a.file))?;
    if let Some(svg) = &a.svg {
        let text = crate::progress::step("drawing the flame graph", || render(&r, Format::Svg, &a.file))?;
        if text.is_empty() {
            eprintln!("fastinst: {}: no sampled stacks, so no flame graph", a.file.display());
        } else {
            std::fs::write(svg, text).map_err(CliError::io(svg))?;
            eprintln!("fastinst: flame graph: {}", svg.display());
        }
    }
    let bytes = crate::progress::step("rendering", || render(&r, a.format, &a.file))?;
    match &a.output {
        Some(p) => std::fs::write(p, bytes).map_err(CliError::io(p)),
        None => crate::print_out(&String::from_utf8(bytes).expect("the text formats are UTF-8")),
    }
}

fn run_diff(before: &Path, a: &ReportArgs) -> Result<()> {
    let (r0, r1) = (load(before)?, load(&a.file)?);
    if let Some(svg) = &a.svg {
        match report::diff::render_diff_svg(&r0, &r1) {
            Ok(Some(text)) => {
                std::fs::write(svg, text).map_err(CliError::io(svg))?;
                eprintln!("fastinst: differential flame graph: {}", svg.display());
            }
            Ok(None) => eprintln!("fastinst: neither profile has sampled stacks, so no flame graph"),
            Err(problem) => {
                return Err(CliError::BadFile {
                    path: a.file.clone(),
                    problem: format!("cannot draw the differential flame graph: {problem}"),
                })
            }
        }
    }
    let text = report::diff::render_diff_text(&r0, &r1);
    match &a.output {
        Some(p) => std::fs::write(p, text).map_err(CliError::io(p)),
        None => crate::print_out(&text),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn parses_formats_and_outputs() {
        let r = parse(&v(&["--format", "folded", "-o", "x.folded", "--svg=g.svg", "p.json"]))
            .unwrap()
            .unwrap();
        assert_eq!(r.format, Format::Folded);
        assert_eq!(r.output.as_deref(), Some(Path::new("x.folded")));
        assert_eq!(r.svg.as_deref(), Some(Path::new("g.svg")));
        assert_eq!(r.file, Path::new("p.json"));
        assert!(parse(&v(&["--format", "pdf", "p.json"])).is_err());
        assert!(parse(&v(&[])).unwrap_err().to_string().contains("no report file"));
    }

    #[test]
    fn files_that_are_not_reports_are_named_with_the_problem() {
        let dir = std::env::temp_dir().join(format!("fastinst-cli-report-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cases = [
            ("a.json", "{\"x\": 1", "not JSON"),
            ("b.json", "{\"x\": 1}", "not a fastinst profile"),
            (
                "c.json",
                "{\"schema\": \"fastinst-profile/9\"}",
                "schema `fastinst-profile/9`",
            ),
            ("d.json", "{\"schema\": \"fastinst-profile/1\"}", "bad field"),
        ];
        for (name, text, want) in cases {
            let p = dir.join(name);
            std::fs::write(&p, text).unwrap();
            let e = load(&p).unwrap_err().to_string();
            assert!(e.starts_with(&p.display().to_string()), "{e}");
            assert!(e.contains(want), "{e}");
        }
        let missing = load(&dir.join("none.json")).unwrap_err().to_string();
        assert!(missing.contains("none.json: No such file"), "{missing}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
