//! The `fastinst` command.
//!
//! - `fastinst run [options] -- PROGRAM ARGS...`: PROGRAM under
//!   `LD_PRELOAD=libfastinst.so`, with the options passed in its
//!   environment ([`run`]); the latency profiler by default. PROGRAM's exit
//!   status is passed on.
//! - `fastinst attach [options] PID`: the runtime loaded into a running
//!   process for a while, then detached ([`attach`]).
//! - `fastinst report FILE.json`: a saved profile rendered again as text,
//!   folded stacks or a flame graph ([`report`]).
//! - `fastinst sites FILE`: the probe sites of an ELF file, read from disk
//!   with the runtime's own recognisers ([`sites`], `providers::offline`).
//! - `fastinst calibrate`: the installation-time T_max benchmark
//!   (`calibrate::cli`).
//!
//! Every command has `--help`; every error names the file or option and
//! the problem. Exit status: the program's for `run`, else 0 on success,
//! 1 on failure, 2 for a wrong command line.

pub mod args;
pub mod attach;
pub mod ctl;
pub mod error;
pub mod library;
pub mod progress;
pub mod report;
pub mod run;
pub mod sites;
pub mod top;

pub use error::{CliError, Result};
use std::process::ExitCode;

/// Usage text of `fastinst`.
pub const USAGE: &str = "\
usage: fastinst COMMAND [options]

Rapid-toggling probes for programs built with -finstrument-functions.

commands:
  run [options] -- PROGRAM [ARGS...]
                    run PROGRAM under libfastinst.so (the latency profiler
                    by default); its exit status is passed on
  attach [options] PID
                    profile running process PID for a while, then detach
                    and leave it as it was
  top [options] [--] PROGRAM [ARGS...]
                    run PROGRAM under the profiler with a live view of
                    its functions, refreshed in the terminal
  ctl (PID | --socket PATH) COMMAND
                    ask a runtime for its status, a report now, or a
                    snapshot of its profile
  report FILE.json  render a saved profile again (text, folded, flame graph)
  sites FILE        list the probe sites of an ELF file
  calibrate         measure T_max on this machine, write the machine config
  help [COMMAND]    this text, or a command's

`fastinst COMMAND --help` describes each command's options.
";

fn usage_of(cmd: &str) -> Option<&'static str> {
    Some(match cmd {
        "run" => run::USAGE,
        "attach" => attach::USAGE,
        "report" => report::USAGE,
        "sites" => sites::USAGE,
        "top" => top::USAGE,
        "ctl" => ctl::USAGE,
        "calibrate" => calibrate::cli::USAGE,
        _ => return None,
    })
}

fn finish(r: Result<ExitCode>) -> ExitCode {
    r.unwrap_or_else(|e| {
        if matches!(e, CliError::Usage(_)) {
            eprintln!("{e}\n(`fastinst help` lists the commands)");
        } else {
            eprintln!("fastinst: {e}");
        }
        ExitCode::from(e.exit_code())
    })
}

fn help(text: &str) -> Result<ExitCode> {
    print_out(text)?;
    Ok(ExitCode::SUCCESS)
}

/// Writes `text` to stdout. A reader that stops early (`| head`) is not
/// an error (`print!` panicked on the broken pipe); any other failure is.
pub(crate) fn print_out(text: &str) -> Result<()> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(CliError::io("<stdout>")(e)),
        _ => Ok(()),
    }
}

/// Runs `fastinst` with `args` (without the program name).
pub fn main(args: &[String]) -> ExitCode {
    let Some((cmd, rest)) = args.split_first() else {
        eprint!("{USAGE}");
        return ExitCode::from(2);
    };
    let r = match cmd.as_str() {
        "run" => run::parse(rest).and_then(|a| match a {
            Some(a) => run::run(&a).map(ExitCode::from),
            None => help(run::USAGE),
        }),
        "attach" => attach::parse(rest).and_then(|a| match a {
            Some(a) => attach::run(&a).map(|()| ExitCode::SUCCESS),
            None => help(attach::USAGE),
        }),
        "report" => report::parse(rest).and_then(|a| match a {
            Some(a) => report::run(&a).map(|()| ExitCode::SUCCESS),
            None => help(report::USAGE),
        }),
        "sites" => sites::parse(rest).and_then(|a| match a {
            Some(a) => sites::run(&a).map(|()| ExitCode::SUCCESS),
            None => help(sites::USAGE),
        }),
        "top" => top::parse(rest).and_then(|a| match a {
            Some(a) => top::run(&a).map(ExitCode::from),
            None => help(top::USAGE),
        }),
        "ctl" => ctl::parse(rest).and_then(|a| match a {
            Some(a) => ctl::run(&a).map(ExitCode::from),
            None => help(ctl::USAGE),
        }),
        "calibrate" => return calibrate::cli::main(rest),
        "help" | "-h" | "--help" => match rest.first() {
            None => help(USAGE),
            Some(c) => match usage_of(c) {
                Some(u) => help(u),
                None => Err(CliError::Usage(format!("fastinst help: no command `{c}`"))),
            },
        },
        "-V" | "--version" => {
            println!("fastinst {}", env!("CARGO_PKG_VERSION"));
            Ok(ExitCode::SUCCESS)
        }
        other => Err(CliError::Usage(format!("fastinst: no command `{other}`"))),
    };
    finish(r)
}
