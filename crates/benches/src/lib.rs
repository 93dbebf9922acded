//! The paper's evaluation reproduced on the machine at hand.
//!
//! Four harnesses:
//! - `fastinst-eval`: the paper's section 8 ([`eval`]): Table 2 toggle and
//!   invocation costs beside a static guard ([`table2`]), Fig. 10 toggle
//!   latency histograms ([`fig10`]), Fig. 11–13 throughput under a toggler
//!   ([`fig11`]), §8.5 the cost of an inactive probe ([`inactive`]) and
//!   Table 1 initialisation cost on real programs ([`table1`]). A C driver
//!   ([`driver`]) linked with `libfastinst.so` measures through the C API;
//!   results come out as Markdown, JSON and SVG plots ([`plot`]).
//! - `fastinst-table3`: Table 3, the latency profiler on real open-source
//!   programs. Their C sources come from crates.io ([`sources`]), are built
//!   with gcc and clang, plain and instrumented ([`programs`]), and run one
//!   at a time under every configuration ([`table3`]); CPU time comes from
//!   `getrusage` ([`measure`]).
//! - `fastinst-shares`: the same programs under `perf record -g`, every CPU
//!   sample charged to the program or to a part of the runtime by its call
//!   chain ([`shares`]): the runtime's direct cost as a share of each run,
//!   which the machine's speed between runs does not move.
//! - `fastinst-cachesim`: the same programs under Valgrind's cachegrind
//!   ([`cachesim`]): the program's own instructions and cache misses with
//!   the sleds' NOPs and under the profiler, the two costs the samples
//!   cannot see, counted where a comparison of timed runs drowns in noise.
//!
//! Every time is in TSC ticks (or CPU seconds for whole programs), reported
//! as median and p90 beside a baseline measured in the same run. The TSC of
//! a virtual machine may advance in coarse steps: cheap operations are
//! timed in batches and divided, and the step seen is printed.
//!
//! `cargo bench -p fastinst-benches` runs the criterion benches of the same
//! operations (`benches/inactive.rs`).

pub mod accuracy;
pub mod aliases;
pub mod cachesim;
pub mod children;
pub mod driver;
pub mod error;
pub mod eval;
pub mod fig10;
pub mod fig11;
pub mod inactive;
pub mod measure;
pub mod perf;
pub mod plot;
pub mod programs;
pub mod shares;
pub mod sources;
pub mod table1;
pub mod table2;
pub mod table3;

pub use error::{EvalError, Result};

/// Where and when a table was measured, and the command that did it, as
/// its heading says: `DATE on CPU (N CPUs, kernel K); `NAME ARGS``.
pub fn provenance(name: &str) -> String {
    let m = calibrate::machine::Machine::detect();
    format!(
        "{} on {} ({} CPUs, kernel {}); `{name}{}`",
        m.date,
        m.cpu_model,
        m.cores,
        m.kernel,
        std::env::args().skip(1).map(|x| format!(" {x}")).collect::<String>()
    )
}

/// A harness's command line, read option by option with the workspace's
/// option reader ([`fastinst_args`]), its errors made usage errors.
pub struct Argv<'a>(fastinst_args::Argv<'a>);

impl<'a> Argv<'a> {
    /// The arguments after the program name.
    pub fn new(argv: &'a [String]) -> Self {
        Argv(fastinst_args::Argv::new(argv))
    }

    /// The next option, if any.
    pub fn next_opt(&mut self) -> Option<&'a str> {
        self.0.next_raw()
    }

    /// The value that follows option `opt`.
    pub fn value(&mut self, opt: &str) -> Result<String> {
        Ok(self.0.value(opt, None)?.to_string())
    }

    /// The value that follows option `opt`, as a count.
    pub fn number(&mut self, opt: &str) -> Result<usize> {
        Ok(self.0.parsed(opt, None, "a number")?)
    }
}

/// The help lines of the options every Table 3 harness takes from
/// [`CommonArgs`], for its usage text (`concat!`): written once, as they
/// are parsed once. Each harness adds its own `--lib` and `--json` lines,
/// whose meaning differs between them.
#[macro_export]
macro_rules! common_options_usage {
    () => {
        "  --programs LIST     a subset of the programs above (lua, zstd and demo
                      only in fastinst-accuracy)
  --compilers LIST    subset of gcc,clang,gcc-sled,clang-sled (sled: the
                      -fpatchable-function-entry=5 builds); also gcc-pg
                      (-pg -mfentry), clang-pg (-pg) and clang-xray
                      (-fxray-instrument)
  --repeat N          each run does its workload N times over (default 1:
                      ~1 s runs); the costs fixed per run (start-up,
                      reports) then weigh 1/N as much
  --work DIR          builds and scratch (default: target/fastinst-eval)
"
    };
}

/// The options the Table 3 harnesses (`fastinst-table3`, `fastinst-shares`,
/// `fastinst-cachesim`) share: which programs and builds, where to build,
/// which library, where to save the JSON, how many times over each run does
/// its workload.
pub struct CommonArgs {
    /// `--programs` (default: all).
    pub programs: Vec<programs::Program>,
    /// `--compilers` (default: all builds).
    pub compilers: Vec<programs::Compiler>,
    /// `--work`: builds and scratch.
    pub work: std::path::PathBuf,
    /// `--lib`: the library to preload.
    pub lib: Option<std::path::PathBuf>,
    /// `--json`: also write the results here.
    pub json: Option<std::path::PathBuf>,
    /// `--repeat`: each run does its workload this many times over (at
    /// least 1), so that the costs fixed per run weigh less.
    pub repeat: usize,
}

impl Default for CommonArgs {
    fn default() -> Self {
        CommonArgs {
            programs: programs::PROGRAMS.to_vec(),
            compilers: programs::Compiler::ALL.to_vec(),
            work: "target/fastinst-eval".into(),
            lib: None,
            json: None,
            repeat: 1,
        }
    }
}

impl CommonArgs {
    /// Takes option `opt`, and its value from `argv`, if it is one of these;
    /// false if it is not.
    pub fn take(&mut self, opt: &str, argv: &mut Argv<'_>) -> Result<bool> {
        match opt {
            "--programs" => self.programs = programs::programs_named(&argv.value(opt)?, opt)?,
            "--compilers" => self.compilers = programs::compilers_named(&argv.value(opt)?, opt)?,
            "--work" => self.work = argv.value(opt)?.into(),
            "--lib" => self.lib = Some(argv.value(opt)?.into()),
            "--json" => self.json = Some(argv.value(opt)?.into()),
            "--repeat" => self.repeat = argv.number(opt)?.max(1),
            _ => return Ok(false),
        }
        Ok(true)
    }
}

/// Reads a harness's saved JSON (`what` names the harness in the error).
pub fn read_json<T: serde::de::DeserializeOwned>(path: &std::path::Path, what: &str) -> Result<T> {
    let text = std::fs::read_to_string(path).map_err(|source| EvalError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|e| EvalError::Tool(format!("{}: not a {what} JSON file: {e}", path.display())))
}

/// Writes `value` as pretty JSON to `path`.
pub fn write_json(path: &std::path::Path, value: &impl serde::Serialize) -> Result<()> {
    let text = serde_json::to_string_pretty(value).expect("tables serialise");
    std::fs::write(path, text).map_err(|source| EvalError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// A harness's `main`: `parse` the arguments (`None`: help asked for),
/// print `usage` for help, `run` the rest; errors go to stderr under the
/// harness's `name`, with exit status 2 for a bad command line and 1 for a
/// failed run.
pub fn harness_main<A>(
    name: &str,
    usage: &str,
    parse: impl FnOnce(&[String]) -> Result<Option<A>>,
    run: impl FnOnce(A) -> Result<()>,
) -> std::process::ExitCode {
    use std::process::ExitCode;
    let argv: Vec<String> = std::env::args().skip(1).collect();
    match parse(&argv) {
        Ok(None) => {
            print!("{usage}");
            ExitCode::SUCCESS
        }
        Ok(Some(a)) => match run(a) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("{name}: {e}");
                ExitCode::FAILURE
            }
        },
        Err(e) => {
            eprintln!("{name}: {e}\n(--help for usage)");
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argv_reads_options_values_and_counts_and_names_the_option_in_errors() {
        let v: Vec<String> = ["--runs", "3", "--lib", "x.so", "--jobs", "many", "--work"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let mut a = Argv::new(&v);
        assert_eq!(a.next_opt(), Some("--runs"));
        assert_eq!(a.number("--runs").unwrap(), 3);
        assert_eq!(a.next_opt(), Some("--lib"));
        assert_eq!(a.value("--lib").unwrap(), "x.so");
        assert_eq!(a.next_opt(), Some("--jobs"));
        assert_eq!(
            a.number("--jobs").unwrap_err().to_string(),
            "--jobs: `many` is not a number"
        );
        assert_eq!(a.next_opt(), Some("--work"));
        assert_eq!(a.value("--work").unwrap_err().to_string(), "--work needs a value");
        assert_eq!(a.next_opt(), None);
    }

    #[test]
    fn common_args_take_their_own_options_and_leave_the_rest() {
        let v: Vec<String> = [
            "--programs",
            "sqlite",
            "--runs",
            "3",
            "--lib",
            "x.so",
            "--repeat",
            "0",
            "--compilers",
            "fortran",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let mut a = Argv::new(&v);
        let mut c = CommonArgs::default();
        assert!(c.take(a.next_opt().unwrap(), &mut a).unwrap());
        assert_eq!(c.programs, vec![programs::Program::Sqlite]);
        assert!(!c.take(a.next_opt().unwrap(), &mut a).unwrap());
        assert_eq!(a.number("--runs").unwrap(), 3);
        assert!(c.take(a.next_opt().unwrap(), &mut a).unwrap());
        assert_eq!(c.lib.as_deref(), Some(std::path::Path::new("x.so")));
        assert_eq!(c.repeat, 1);
        assert!(c.take(a.next_opt().unwrap(), &mut a).unwrap());
        assert_eq!(c.repeat, 1, "a workload is done at least once");
        assert!(c.take(a.next_opt().unwrap(), &mut a).is_err());
        assert_eq!(c.work, std::path::PathBuf::from("target/fastinst-eval"));
    }
}
