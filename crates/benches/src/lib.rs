//! The paper's evaluation reproduced on the machine at hand.
//!
//! Three harnesses:
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
//!
//! Every time is in TSC ticks (or CPU seconds for whole programs), reported
//! as median and p90 beside a baseline measured in the same run. The TSC of
//! a virtual machine may advance in coarse steps: cheap operations are
//! timed in batches and divided, and the step seen is printed.
//!
//! `cargo bench -p fastinst-benches` runs the criterion benches of the same
//! operations (`benches/inactive.rs`).

pub mod driver;
pub mod error;
pub mod eval;
pub mod fig10;
pub mod fig11;
pub mod inactive;
pub mod measure;
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
