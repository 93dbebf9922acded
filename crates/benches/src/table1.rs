//! The paper's Table 1: probe initialisation cost as a share of run time on
//! the real programs of Table 3.
//!
//! Each instrumented build runs under `LD_PRELOAD=libfastinst.so` with
//! `FASTINST_TOOL=off` (every probe discovered, then deactivated) and
//! `FASTINST_LOG=info`; the runtime's exit line `init total N ticks
//! (modules M, sleds S, discovery D)` gives what it spent setting probes
//! up: reading the modules' symbols, registering sleds, and every discovery
//! run (finding, classifying and switching off each site). That time, at
//! the TSC's rate, is set against the same run's CPU time.

use crate::error::{EvalError, Result};
use crate::measure::{median, run_once};
use crate::programs::{Binary, Compiler, Program};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// One program and build.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Row {
    /// Program.
    pub program: String,
    /// Build.
    pub compiler: Compiler,
    /// Probes registered.
    pub probes: u64,
    /// Median over rounds: total init ticks.
    pub init_ticks: f64,
    /// Of which reading module symbols.
    pub modules_ticks: f64,
    /// Of which registering sleds.
    pub sled_ticks: f64,
    /// Of which discovery runs.
    pub discovery_ticks: f64,
    /// Median CPU seconds of the run.
    pub cpu_s: f64,
    /// init_ticks at the TSC rate, as % of cpu_s.
    pub init_pct: f64,
}

/// The table.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Table1 {
    /// TSC rate used, MHz.
    pub tsc_mhz: f64,
    /// Rounds per row.
    pub rounds: usize,
    /// The rows.
    pub rows: Vec<Row>,
}

/// The numbers of the runtime's `init total` line, and its probe count.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct InitLine {
    /// Total ticks.
    pub total: u64,
    /// Reading module symbols.
    pub modules: u64,
    /// Registering sleds.
    pub sleds: u64,
    /// Discovery runs.
    pub discovery: u64,
    /// Probes (from the `N probes (...)` line; 0 if absent).
    pub probes: u64,
}

fn number_after(line: &str, key: &str) -> Option<u64> {
    let rest = &line[line.find(key)? + key.len()..];
    let digits: String = rest.trim_start().chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// Parses the runtime's exit lines from a run's standard error.
pub fn parse_init(stderr: &str) -> Option<InitLine> {
    let line = stderr.lines().find(|l| l.contains("init total "))?;
    let probes = stderr
        .lines()
        .find(|l| l.contains(" probes (") && l.contains("discovery"))
        .and_then(|l| {
            // The count is the word before " probes (" (the line starts
            // with `fastinst[pid]: info:`).
            let head = &l[..l.find(" probes (")?];
            head.rsplit(' ').next()?.parse().ok()
        })
        .unwrap_or(0);
    Some(InitLine {
        total: number_after(line, "init total ")?,
        modules: number_after(line, "modules ")?,
        sleds: number_after(line, "sleds ")?,
        discovery: number_after(line, "discovery ")?,
        probes,
    })
}

/// Runs each instrumented binary `rounds` times under the `off` tool.
pub fn measure(
    bins: &[Binary],
    programs: &[Program],
    work: &Path,
    lib: &Path,
    rounds: usize,
    tsc_mhz: f64,
) -> Result<Table1> {
    let mut rows = Vec::new();
    for &p in programs {
        let args = p.workload(work)?;
        for b in bins.iter().filter(|b| b.program == p && b.instrumented) {
            let out: PathBuf = work
                .join("out")
                .join(format!("table1-{}-{}", p.name(), b.compiler.name()));
            std::fs::create_dir_all(&out).map_err(EvalError::io(&out))?;
            let env = [
                ("LD_PRELOAD".to_string(), lib.display().to_string()),
                ("FASTINST_TOOL".to_string(), "off".to_string()),
                ("FASTINST_LOG".to_string(), "info".to_string()),
                ("FASTINST_OUT".to_string(), out.display().to_string()),
            ];
            let mut lines = Vec::new();
            let mut cpu = Vec::new();
            for _ in 0..rounds.max(1) {
                let run = run_once(&b.path, &args, &env, &out.join("stdout"))?;
                if run.code != Some(0) {
                    return Err(EvalError::WrongResult(format!(
                        "{} {}: exit status {:?}\n{}",
                        p.name(),
                        b.compiler.name(),
                        run.code,
                        run.stderr
                    )));
                }
                let l = parse_init(&run.stderr).ok_or_else(|| {
                    EvalError::WrongResult(format!(
                        "{} {}: the runtime printed no `init total` line:\n{}",
                        p.name(),
                        b.compiler.name(),
                        run.stderr
                    ))
                })?;
                eprintln!(
                    "  table 1: {:<8} {:<10} init {} ticks, cpu {:.3} s",
                    p.name(),
                    b.compiler.name(),
                    l.total,
                    run.cpu_s
                );
                lines.push(l);
                cpu.push(run.cpu_s);
            }
            let _ = std::fs::remove_dir_all(&out);
            let m = |f: fn(&InitLine) -> u64| median(&lines.iter().map(|l| f(l) as f64).collect::<Vec<_>>());
            let init = m(|l| l.total);
            let cpu_s = median(&cpu);
            rows.push(Row {
                program: p.name().into(),
                compiler: b.compiler,
                probes: lines.iter().map(|l| l.probes).max().unwrap_or(0),
                init_ticks: init,
                modules_ticks: m(|l| l.modules),
                sled_ticks: m(|l| l.sleds),
                discovery_ticks: m(|l| l.discovery),
                cpu_s,
                init_pct: 100.0 * init / (tsc_mhz * 1e6) / cpu_s,
            });
        }
    }
    Ok(Table1 {
        tsc_mhz,
        rounds: rounds.max(1),
        rows,
    })
}

impl Table1 {
    /// The table as Markdown.
    pub fn markdown(&self) -> String {
        let mut s = format!(
            "Medians over {} run(s) with every probe switched off at discovery (`FASTINST_TOOL=off`); \
             ms at the TSC's {:.0} MHz.\n\n",
            self.rounds, self.tsc_mhz
        );
        s.push_str(
            "| program | build | probes | init ms | modules ms | sleds ms | discovery ms | run CPU s | init % of run |\n\
             | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n",
        );
        let ms = |t: f64| t / (self.tsc_mhz * 1e3);
        for r in &self.rows {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.3}% |",
                r.program,
                r.compiler.name(),
                r.probes,
                ms(r.init_ticks),
                ms(r.modules_ticks),
                ms(r.sled_ticks),
                ms(r.discovery_ticks),
                r.cpu_s,
                r.init_pct
            );
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_runtime_exit_lines() {
        let err = "app output\nfastinst[77]: info: 4242 probes (3 unrecognised, 0 with the id passed in the argument); discovery 100 ticks per run over 7 runs\n\
                   fastinst[77]: info: init total 123456 ticks (modules 1000, sleds 22, discovery 122434)\n";
        let l = parse_init(err).unwrap();
        assert_eq!(
            l,
            InitLine {
                total: 123456,
                modules: 1000,
                sleds: 22,
                discovery: 122434,
                probes: 4242
            }
        );
        assert_eq!(parse_init("nothing here"), None);
    }
}
