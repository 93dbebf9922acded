//! The whole §8 evaluation: runs the sections asked for, then writes the
//! report as Markdown (`eval.md`), JSON (`eval.json`, the [`Report`]
//! structure) and SVG plots (`fig10.svg`, `fig11-aa.svg`, `fig11-ad.svg`).

use crate::error::{EvalError, Result};
use crate::programs::{build_all, installed, Compiler, PROGRAMS};
use crate::{driver, fig10, fig11, inactive, sources, table1, table2};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// A part of the evaluation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Section {
    /// Table 2: toggle and invocation costs.
    Table2,
    /// Fig. 10: toggle latency histograms.
    Fig10,
    /// Fig. 11–13: throughput under a toggler.
    Fig11,
    /// §8.5: inactive probe cost.
    Inactive,
    /// Table 1: initialisation cost on real programs.
    Table1,
}

impl Section {
    /// Every section, in report order.
    pub const ALL: [Section; 5] = [
        Section::Table2,
        Section::Fig10,
        Section::Fig11,
        Section::Inactive,
        Section::Table1,
    ];

    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Section::Table2 => "table2",
            Section::Fig10 => "fig10",
            Section::Fig11 => "fig11",
            Section::Inactive => "inactive",
            Section::Table1 => "table1",
        }
    }
}

/// How much to measure.
#[derive(Clone, Debug)]
pub struct Options {
    /// The quick run (under 2 minutes once the real programs are built).
    pub quick: bool,
    /// Sections to run.
    pub sections: Vec<Section>,
    /// Builds and scratch.
    pub work: PathBuf,
    /// Where the report goes.
    pub out: PathBuf,
    /// `libfastinst.so`.
    pub lib: PathBuf,
    /// Most executor threads in Fig. 11 (default: the CPUs online).
    pub max_threads: usize,
    /// Functions in the generated `-finstrument-functions` field (default
    /// [`FIELD`]); fewer build faster, and Fig. 10 then toggles fewer probes.
    pub field: usize,
    /// The command line, for the report.
    pub command: String,
}

/// Where and when it ran.
#[derive(Clone, Debug, serde::Serialize)]
pub struct MachineInfo {
    /// CPU model.
    pub cpu: String,
    /// CPUs online.
    pub cpus: usize,
    /// Kernel release.
    pub kernel: String,
    /// UTC date.
    pub date: String,
    /// TSC rate, MHz.
    pub tsc_mhz: f64,
    /// The smallest step of the TSC seen, ticks.
    pub tsc_step: u64,
}

/// Everything measured.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Report {
    /// The machine.
    pub machine: MachineInfo,
    /// The command that produced it.
    pub command: String,
    /// Quick mode.
    pub quick: bool,
    /// Table 2.
    pub table2: Option<table2::Table2>,
    /// Fig. 10.
    pub fig10: Option<fig10::Fig10>,
    /// Fig. 11–13.
    pub fig11: Option<fig11::Fig11>,
    /// §8.5.
    pub inactive: Option<inactive::Inactive>,
    /// Table 1.
    pub table1: Option<table1::Table1>,
    /// Seconds the evaluation took.
    pub seconds: f64,
}

/// Functions in the `-finstrument-functions` field: 16,000 functions give
/// 32,000 sites, about 2,000 of them straddlers, enough for Fig. 10's
/// 20,000 probes with 10% straddlers.
pub const FIELD: usize = 16_000;
/// Functions in the sled field.
const SLED_FIELD: usize = 2_000;

/// Runs the evaluation and writes its files under `opts.out`.
pub fn run(opts: &Options) -> Result<Report> {
    let started = Instant::now();
    let m = calibrate::machine::Machine::detect();
    let machine = MachineInfo {
        cpu: m.cpu_model.clone(),
        cpus: m.cores,
        kernel: m.kernel.clone(),
        date: m.date.clone(),
        tsc_mhz: m.tsc_mhz,
        tsc_step: stress::bench::tsc_resolution(),
    };
    let has = |s: Section| opts.sections.contains(&s);
    let needs_driver = has(Section::Table2) || has(Section::Fig10) || has(Section::Fig11);
    let drv = if needs_driver {
        eprintln!("building the driver (cached once built)");
        Some(driver::build(&opts.work, &opts.lib, opts.field, SLED_FIELD)?)
    } else {
        None
    };
    let drv = || drv.as_ref().expect("built when a section needs it");
    let mut report = Report {
        machine,
        command: opts.command.clone(),
        quick: opts.quick,
        table2: None,
        fig10: None,
        fig11: None,
        inactive: None,
        table1: None,
        seconds: 0.0,
    };
    if has(Section::Table2) {
        eprintln!("table 2");
        report.table2 = Some(table2::measure(drv(), if opts.quick { 11 } else { 31 })?);
    }
    if has(Section::Fig10) {
        eprintln!("fig. 10");
        report.fig10 = Some(fig10::measure(drv(), 20_000)?);
    }
    if has(Section::Fig11) {
        eprintln!("fig. 11-13");
        report.fig11 = Some(fig11::measure(
            drv(),
            if opts.quick { 100 } else { 300 },
            if opts.quick { 1 } else { 3 },
            opts.max_threads,
        )?);
    }
    if has(Section::Inactive) {
        eprintln!("section 8.5");
        report.inactive = Some(inactive::measure(if opts.quick { 101 } else { 501 })?);
    }
    if has(Section::Table1) {
        eprintln!("table 1");
        let wanted = if opts.quick {
            vec![Compiler::Gcc, Compiler::GccSled]
        } else {
            Compiler::ALL.to_vec()
        };
        let compilers = installed(&wanted, "its builds are left out of table 1");
        let srcs = sources::fetch(&opts.work)?;
        let bins = build_all(&opts.work, &srcs, &PROGRAMS, &compilers)?;
        report.table1 = Some(table1::measure(
            &bins,
            &PROGRAMS,
            &opts.work,
            &opts.lib,
            if opts.quick { 1 } else { 3 },
            report.machine.tsc_mhz,
        )?);
    }
    report.seconds = started.elapsed().as_secs_f64();
    write(&report, &opts.out)?;
    Ok(report)
}

fn save(dir: &Path, name: &str, text: &str) -> Result<()> {
    let p = dir.join(name);
    std::fs::write(&p, text).map_err(EvalError::io(&p))
}

fn write(r: &Report, out: &Path) -> Result<()> {
    std::fs::create_dir_all(out).map_err(EvalError::io(out))?;
    save(out, "eval.md", &r.markdown())?;
    save(
        out,
        "eval.json",
        &serde_json::to_string_pretty(r).expect("the report serialises"),
    )?;
    if let Some(f) = &r.fig10 {
        save(out, "fig10.svg", &f.svg())?;
    }
    if let Some(f) = &r.fig11 {
        save(out, "fig11-aa.svg", &f.svg("aa"))?;
        save(out, "fig11-ad.svg", &f.svg("ad"))?;
    }
    Ok(())
}

impl Report {
    /// The report as Markdown.
    pub fn markdown(&self) -> String {
        let m = &self.machine;
        let mut s = format!(
            "# fastinst: the paper's section 8 on this machine\n\n\
             {} ({} CPUs), Linux {}, TSC {:.0} MHz. Timer resolution: the smallest TSC step seen was {} tick(s); \
             cheap operations are timed in batches and divided either way, since a virtual machine's TSC may step \
             coarsely. {}. Produced by `{}` in {:.0} s.\n",
            m.cpu, m.cpus, m.kernel, m.tsc_mhz, m.tsc_step, m.date, self.command, self.seconds
        );
        if let Some(t) = &self.table2 {
            s.push_str("\n## Table 2: toggle and invocation cost (TSC ticks)\n\n");
            s.push_str(&t.markdown());
        }
        if let Some(f) = &self.fig10 {
            s.push_str("\n## Fig. 10: toggle latency over 20,000 probes (`fig10.svg`)\n\n");
            s.push_str(&f.markdown());
        }
        if let Some(f) = &self.fig11 {
            s.push_str(
                "\n## Fig. 11-13: calls/s through a hot probe under a toggler (`fig11-aa.svg`, `fig11-ad.svg`)\n\n",
            );
            s.push_str(&f.markdown());
        }
        if let Some(i) = &self.inactive {
            s.push_str("\n## Section 8.5: the cost of an inactive probe (TSC ticks per call)\n\n");
            s.push_str(&i.markdown());
        }
        if let Some(t) = &self.table1 {
            s.push_str("\n## Table 1: probe initialisation cost on real programs\n\n");
            s.push_str(&t.markdown());
        }
        s
    }
}
