//! `fastinst sites`: the probe sites of an ELF file, read from disk.

use crate::args::{Args, Item};
use crate::error::{CliError, Result};
use providers::finstrument::{HookKind, SiteForm};
use providers::offline::{sites_in_elf, FileSite, FileSites};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Usage text.
pub const USAGE: &str = "\
usage: fastinst sites [options] FILE

Lists the probe sites of an ELF executable or shared library built with
-finstrument-functions, -fpatchable-function-entry=5 or -pg, as the runtime
would recognise them: each hook call or tail jump, each entry NOP sled, each
-pg profiling call and XRay entry sled (which the runtime turns into sleds)
and each Rust point probe (listed as `point NAME`), with
its function, entry/exit, form (call, plt, got, tail, tail-plt, tail-got,
sled), address (the file's) and straddle split (bytes in the first|second
64-byte line, `-` when it does not straddle); then totals. A hook site in an
inlined function is listed under the function it was inlined into; a sled
site stands for both the entry and the exit probe of its function.

options:
  --straddlers      list only the sites that straddle a cache line
  --summary         totals only
  --json            the same as JSON
  -h, --help        this text
";

/// A parsed `fastinst sites`.
#[derive(Debug, PartialEq, Eq)]
pub struct SitesArgs {
    /// The ELF file.
    pub file: PathBuf,
    /// `--straddlers`.
    pub straddlers_only: bool,
    /// `--summary`.
    pub summary: bool,
    /// `--json`.
    pub json: bool,
}

/// Parses the arguments of `fastinst sites`; `None` for `--help`.
pub fn parse(argv: &[String]) -> Result<Option<SitesArgs>> {
    let mut a = Args::new("sites", argv);
    let mut file = None;
    let (mut straddlers_only, mut summary, mut json) = (false, false, false);
    while let Some(item) = a.next_item() {
        match item {
            Item::Opt("-h" | "--help", _) => return Ok(None),
            Item::Opt("--straddlers", None) => straddlers_only = true,
            Item::Opt("--summary", None) => summary = true,
            Item::Opt("--json", None) => json = true,
            Item::Opt(other, _) => return Err(a.unknown(other)),
            Item::Positional(p) => a.one_file(&mut file, p, "file")?,
            Item::EndOfOptions => a.one_file_after_options(&mut file, "file")?,
        }
    }
    let file = file.ok_or_else(|| a.usage("no file given (fastinst sites FILE)"))?;
    Ok(Some(SitesArgs {
        file,
        straddlers_only,
        summary,
        json,
    }))
}

/// The straddle split of a site: bytes in the first line, 0 if none.
fn split(s: &FileSite) -> usize {
    wordpatch::split(s.site.addr as usize, s.site.len())
}

fn split_text(s: &FileSite) -> String {
    match split(s) {
        0 => "-".into(),
        k => format!("{k}|{}", s.site.len() - k),
    }
}

fn kind_name(k: HookKind) -> &'static str {
    match k {
        HookKind::Enter => "entry",
        HookKind::Exit => "exit",
    }
}

/// Totals over a file's sites.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Totals {
    /// Function symbols with a size.
    pub functions: usize,
    /// Of those, with at least one site.
    pub functions_with_sites: usize,
    /// All sites.
    pub sites: usize,
    /// Entry sites.
    pub entry: usize,
    /// Exit sites (calls and tail jumps).
    pub exit: usize,
    /// Sites per form name.
    pub forms: BTreeMap<&'static str, usize>,
    /// Straddling sites per split (`"1|4"` ...).
    pub straddlers: BTreeMap<String, usize>,
}

impl Totals {
    /// Counts `s`.
    pub fn of(s: &FileSites) -> Totals {
        let mut t = Totals {
            functions: s.functions,
            sites: s.sites.len(),
            ..Totals::default()
        };
        let mut funcs = std::collections::BTreeSet::new();
        for site in &s.sites {
            funcs.insert(site.function_start);
            match site.site.kind {
                HookKind::Enter => t.entry += 1,
                HookKind::Exit => t.exit += 1,
            }
            *t.forms.entry(site.site.form.name()).or_default() += 1;
            if split(site) != 0 {
                *t.straddlers.entry(split_text(site)).or_default() += 1;
            }
        }
        t.functions_with_sites = funcs.len();
        t
    }

    /// How many sites straddle a line.
    pub fn straddling(&self) -> usize {
        self.straddlers.values().sum()
    }
}

/// Reads `path` and finds its sites.
pub fn load(path: &Path) -> Result<FileSites> {
    let bytes = std::fs::read(path).map_err(CliError::io(path))?;
    let found = sites_in_elf(&bytes).map_err(|e| CliError::BadFile {
        path: path.into(),
        problem: e.to_string(),
    })?;
    if !found.has_hooks {
        return Err(CliError::BadFile {
            path: path.into(),
            problem: "no probe sites: it neither calls nor defines __cyg_profile_func_enter/exit \
                      and has no __patchable_function_entries table (was it built with \
                      -finstrument-functions or -fpatchable-function-entry=5?)"
                .into(),
        });
    }
    Ok(found)
}

/// The listing as text.
pub fn render_text(a: &SitesArgs, s: &FileSites) -> String {
    let t = Totals::of(s);
    let mut out = String::new();
    if !a.summary {
        let _ = writeln!(
            out,
            "{:<18} {:<5} {:<8} {:<5} function",
            "address", "probe", "form", "split"
        );
        for site in s.sites.iter().filter(|x| !a.straddlers_only || split(x) != 0) {
            let _ = writeln!(
                out,
                "{:<#18x} {:<5} {:<8} {:<5} {}",
                site.site.addr,
                kind_name(site.site.kind),
                site.site.form.name(),
                split_text(site),
                site.function
            );
        }
        out.push('\n');
    }
    let pct = |n: usize| {
        if t.sites == 0 {
            0.0
        } else {
            100.0 * n as f64 / t.sites as f64
        }
    };
    let _ = writeln!(
        out,
        "{}: {} sites ({} entry, {} exit) in {} of {} functions",
        a.file.display(),
        t.sites,
        t.entry,
        t.exit,
        t.functions_with_sites,
        t.functions
    );
    let forms: Vec<String> = t.forms.iter().map(|(f, n)| format!("{f} {n}")).collect();
    let _ = writeln!(out, "forms: {}", forms.join(", "));
    let splits: Vec<String> = t.straddlers.iter().map(|(k, n)| format!("{k} {n}")).collect();
    let _ = writeln!(
        out,
        "straddling a 64-byte line: {} ({:.1}%){}{}",
        t.straddling(),
        pct(t.straddling()),
        if splits.is_empty() { "" } else { ": " },
        splits.join(", ")
    );
    if !s.unusable_sleds.is_empty() {
        let list: Vec<String> = s
            .unusable_sleds
            .iter()
            .map(|(a, why)| format!("{a:#x}: {why}"))
            .collect();
        let _ = writeln!(out, "sleds left alone: {}", list.join("; "));
    }
    if !s.undecodable.is_empty() {
        let _ = writeln!(
            out,
            "not decoded to their end (data in code; later sites not listed): {}",
            s.undecodable.join(", ")
        );
    }
    out
}

/// The listing as JSON.
pub fn render_json(a: &SitesArgs, s: &FileSites) -> String {
    let t = Totals::of(s);
    let sites: Vec<serde_json::Value> = if a.summary {
        Vec::new()
    } else {
        s.sites
            .iter()
            .filter(|x| !a.straddlers_only || split(x) != 0)
            .map(|x| {
                serde_json::json!({
                    "address": format!("{:#x}", x.site.addr),
                    "probe": kind_name(x.site.kind),
                    "form": x.site.form.name(),
                    "len": x.site.len(),
                    "split": split(x),
                    "function": x.function,
                    "function_address": format!("{:#x}", x.function_start),
                })
            })
            .collect()
    };
    let v = serde_json::json!({
        "file": a.file.display().to_string(),
        "functions": t.functions,
        "functions_with_sites": t.functions_with_sites,
        "sites_total": t.sites,
        "entry": t.entry,
        "exit": t.exit,
        "forms": t.forms,
        "straddling": t.straddling(),
        "straddlers_by_split": t.straddlers,
        "undecodable": s.undecodable,
        "unusable_sleds": s.unusable_sleds.iter().map(|(a, why)| serde_json::json!({"address": format!("{a:#x}"), "why": why})).collect::<Vec<_>>(),
        "sites": sites,
    });
    serde_json::to_string_pretty(&v).expect("plain JSON values serialise") + "\n"
}

/// Runs `fastinst sites`.
pub fn run(a: &SitesArgs) -> Result<()> {
    let s = crate::progress::step(&format!("reading the sites of {}", a.file.display()), || load(&a.file))?;
    crate::print_out(&if a.json { render_json(a, &s) } else { render_text(a, &s) })
}

/// The forms a site listing can show (for documentation tests).
pub const FORMS: [SiteForm; 7] = [
    SiteForm::Call,
    SiteForm::CallPlt,
    SiteForm::CallGot,
    SiteForm::TailJmp,
    SiteForm::TailJmpPlt,
    SiteForm::TailJmpGot,
    SiteForm::Sled,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_form_is_named_in_the_usage() {
        for f in FORMS {
            assert!(USAGE.contains(f.name()), "{}", f.name());
        }
    }

    #[test]
    fn a_file_without_hooks_is_refused_by_name() {
        // Not this test binary: it links the runtime, which defines the hooks.
        let e = load(Path::new("/bin/sh")).unwrap_err().to_string();
        assert!(e.starts_with("/bin/sh: "), "{e}");
        assert!(e.contains("-finstrument-functions"), "{e}");
        let e = load(Path::new("/nonexistent/app")).unwrap_err().to_string();
        assert!(e.starts_with("/nonexistent/app: "), "{e}");
    }
}
