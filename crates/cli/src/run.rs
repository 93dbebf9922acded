//! `fastinst run`: a program under `LD_PRELOAD=libfastinst.so`.

use crate::args::{Args, Item};
use crate::error::{CliError, Result};
use crate::library;
use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Usage text.
pub const USAGE: &str = "\
usage: fastinst run [options] [--] PROGRAM [ARGS...]

Runs PROGRAM (built with -finstrument-functions, -fpatchable-function-entry=5
or -pg, or Rust code with #[fastinst::instrument]) with libfastinst.so
preloaded and the options below passed in its environment. PROGRAM's
stdin, stdout and stderr are its own; the exit status is PROGRAM's, or
128+N if signal N killed it. Reports are named by pid (fastinst-profile.
<pid>.{txt,json,folded,svg}) and one line on stderr says where they are.

options:
  --tool T          profile (default: the latency profiler), count (exact
                    calls), trace (every call timed: exact calls, times
                    and percentiles, for short runs), off (every probe
                    off: the floor of the build), none
  --out DIR         directory for the reports (created; default: .)
  --samples K       profiler: calls timed per function per epoch, drawn
                    at random among its counted calls (default 10)
  --epoch-ms MS     profiler: epoch length (default 10)
  --windows N       profiler: counting windows per busy function per
                    epoch, 1 to 64 (default 2): more, tighter call
                    estimates at more cost
  --density D       profiler: counting hooks per 1,000 ticks of program
                    time that the open counting windows may run together, 1
                    to 1000 (default 20): lower counts less and drops more
                    of the planned windows, cheaper and less accurate
  --share P         profiler: the share of the program's CPU time, in
                    percent, 1 to 90, that the profiler holds itself to by
                    timing fewer calls (default 20): lower, call estimates
                    less biased by the hooks' cost and fewer calls timed
  --no-cpu          profiler: no CPU samples (self time from call times)
  --functions GLOBS every tool: probe only the functions matching one of
                    these comma-separated globs (`*`, `?`); the others'
                    probes stay off and cost nothing
  --exclude GLOBS   every tool: never probe the functions matching these
  --modules GLOBS   every tool: probe only the functions in these modules
                    (the executable's or a library's file name)
  --min-duration D  trace and profiler timelines: keep only calls that
                    lasted at least D (wall time; 250us, 1.5ms, 2s; a bare
                    number is microseconds): each slow call with the calls
                    around it, its path; the others are counted
  --depth N         trace timeline: keep only calls at most N deep on
                    their thread (the outermost traced call is 1)
  --inlined         every tool: also count, time and sample the copies of
                    functions that gcc's -finstrument-functions left
                    inlined in others (off by default: their time is
                    their callers')
  --wx, --no-wx     W^X (default off here, on for attach): code pages stay
                    read+execute and are patched through a writable alias
                    of the same memory (docs/attach.md, W^X)
  --signal SIG      profiler: USR1, USR2 or a number; write the reports
                    whenever PROGRAM receives it
  --control PATH    serve a control socket at PATH (mode 0600), which
                    `fastinst ctl --socket PATH status|report|snapshot`
                    talks to
  --strategy S      flip (default), paper, word-sync, word-async
  --client PATH     a client library to load (FASTINST_CLIENT)
  --log LEVEL       error, warn (default), info, debug
  --lib PATH        the libfastinst.so to preload (default: $FASTINST_LIB,
                    else beside this binary)
  --print           after PROGRAM exits, print its text report on stderr
  -h, --help        this text
";

/// A parsed `fastinst run`.
#[derive(Debug, Default, PartialEq)]
pub struct RunArgs {
    /// `FASTINST_*` variables to set, in order.
    pub env: Vec<(&'static str, String)>,
    /// `--lib`.
    pub lib: Option<PathBuf>,
    /// `--out`.
    pub out: Option<PathBuf>,
    /// The tool (for `--print`).
    pub tool: String,
    /// `--print`.
    pub print: bool,
    /// The program and its arguments.
    pub command: Vec<String>,
}

fn one_of(a: &Args, name: &str, v: &str, allowed: &[&str]) -> Result<String> {
    if allowed.contains(&v) {
        Ok(v.to_string())
    } else {
        Err(a.usage(format!("{name}: `{v}` is not one of {}", allowed.join(", "))))
    }
}

/// Parses the arguments of `fastinst run`; `None` for `--help`.
pub fn parse(argv: &[String]) -> Result<Option<RunArgs>> {
    let mut a = Args::new("run", argv);
    let mut r = RunArgs {
        tool: "profile".into(),
        ..RunArgs::default()
    };
    while let Some(item) = a.next_item() {
        match item {
            Item::EndOfOptions => {
                r.command = a.remaining().to_vec();
                break;
            }
            Item::Positional(p) => {
                r.command = std::iter::once(p.to_string())
                    .chain(a.remaining().iter().cloned())
                    .collect();
                break;
            }
            Item::Opt("-h" | "--help", _) => return Ok(None),
            Item::Opt("--print", None) => r.print = true,
            Item::Opt(other, i) => {
                if !runtime_option(&mut a, other, i, &mut r)? {
                    return Err(a.unknown(other));
                }
            }
        }
    }
    if r.command.is_empty() {
        return Err(a.usage("no program to run (fastinst run [options] -- PROGRAM [ARGS...])"));
    }
    Ok(Some(r))
}

/// One option that configures the runtime (`fastinst run`'s and
/// `fastinst attach`'s), into `r`; false if `name` is not one.
pub(crate) fn runtime_option<'a>(a: &mut Args<'a>, name: &'a str, i: Option<&'a str>, r: &mut RunArgs) -> Result<bool> {
    match (name, i) {
        ("--inlined", None) => r.env.push(("FASTINST_INLINED", "1".into())),
        ("--wx", None) => r.env.push(("FASTINST_WX", "1".into())),
        ("--no-wx", None) => r.env.push(("FASTINST_WX", "0".into())),
        (n @ "--functions", i) => r.env.push(("FASTINST_FUNCTIONS", a.value(n, i)?.into())),
        (n @ "--exclude", i) => r.env.push(("FASTINST_EXCLUDE", a.value(n, i)?.into())),
        (n @ "--modules", i) => r.env.push(("FASTINST_MODULES", a.value(n, i)?.into())),
        ("--no-cpu", None) => r.env.push(("FASTINST_PROFILE_CPU", "0".into())),
        (n @ "--min-duration", i) => {
            let v = a.value(n, i)?;
            let us = duration_us(v)
                .ok_or_else(|| a.usage(format!("{n}: `{v}` is not a duration (a number with ns, us, ms or s)")))?;
            r.env.push(("FASTINST_MIN_DURATION_US", a_value(us)));
        }
        (n @ "--depth", i) => {
            let d: u32 = a.parsed(n, i, "a whole number")?;
            if d == 0 {
                return Err(a.usage(format!("{n}: the outermost call is at depth 1")));
            }
            r.env.push(("FASTINST_MAX_DEPTH", d.to_string()));
        }
        (n @ "--windows", i) => {
            let w: u32 = a.parsed(n, i, "a whole number")?;
            if !(1..=64).contains(&w) {
                return Err(a.usage(format!("{n}: {w} is not in 1 to 64")));
            }
            r.env.push(("FASTINST_PROFILE_WINDOWS", w.to_string()));
        }
        (n @ "--density", i) => {
            let d: u32 = a.parsed(n, i, "a whole number")?;
            if !(1..=1000).contains(&d) {
                return Err(a.usage(format!("{n}: {d} is not in 1 to 1000")));
            }
            r.env.push(("FASTINST_PROFILE_DENSITY", d.to_string()));
        }
        (n @ "--share", i) => {
            let p: u32 = a.parsed(n, i, "a whole number")?;
            if !(1..=90).contains(&p) {
                return Err(a.usage(format!("{n}: {p} is not in 1 to 90")));
            }
            r.env.push(("FASTINST_PROFILE_SHARE", p.to_string()));
        }
        (n @ "--tool", i) => {
            let v = a.value(n, i)?;
            r.tool = one_of(a, n, v, &["profile", "count", "trace", "off", "none"])?;
            r.env.push(("FASTINST_TOOL", r.tool.clone()));
        }
        (n @ "--out", i) => r.out = Some(a.value(n, i)?.into()),
        (n @ "--control", i) => r.env.push(("FASTINST_CONTROL", a.value(n, i)?.into())),
        (n @ "--samples", i) => {
            let k: u32 = a.parsed(n, i, "a whole number")?;
            if k < 2 {
                return Err(a.usage(format!("{n}: at least 2 samples are needed to estimate a rate")));
            }
            r.env.push(("FASTINST_PROFILE_SAMPLES", k.to_string()));
        }
        (n @ "--epoch-ms", i) => {
            let ms: f64 = a.parsed(n, i, "a number of milliseconds")?;
            if !(ms > 0.0 && ms.is_finite()) {
                return Err(a.usage(format!("{n}: the period must be positive")));
            }
            r.env.push(("FASTINST_PROFILE_EPOCH_MS", a_value(ms)));
        }
        (n @ "--signal", i) => {
            let v = a.value(n, i)?;
            let ok = matches!(v, "USR1" | "USR2" | "SIGUSR1" | "SIGUSR2")
                || v.parse::<i32>().is_ok_and(|s| (1..=64).contains(&s));
            if !ok {
                return Err(a.usage(format!("{n}: `{v}` is not USR1, USR2 or a signal number")));
            }
            r.env
                .push(("FASTINST_PROFILE_SIGNAL", v.trim_start_matches("SIG").to_string()));
        }
        (n @ "--strategy", i) => {
            let v = a.value(n, i)?;
            let s = one_of(a, n, v, &["flip", "paper", "word-sync", "word-async"])?;
            r.env.push(("FASTINST_STRATEGY", s));
        }
        (n @ "--client", i) => {
            let v = a.value(n, i)?;
            let p = Path::new(v).canonicalize().map_err(CliError::io(v))?;
            r.env.push(("FASTINST_CLIENT", p.display().to_string()));
        }
        (n @ "--log", i) => {
            let v = a.value(n, i)?;
            let l = one_of(a, n, v, &["error", "warn", "info", "debug"])?;
            r.env.push(("FASTINST_LOG", l));
        }
        (n @ "--lib", i) => r.lib = Some(a.value(n, i)?.into()),
        _ => return Ok(false),
    }
    Ok(true)
}

/// `v` (a number with `ns`, `us`, `ms` or `s`; bare: microseconds) in
/// microseconds, if it is a duration of zero or more.
fn duration_us(v: &str) -> Option<f64> {
    let v = v.trim();
    let (num, scale) = [("ns", 1e-3), ("us", 1.0), ("ms", 1e3), ("s", 1e6)]
        .iter()
        .find_map(|&(unit, scale)| v.strip_suffix(unit).map(|n| (n, scale)))
        .unwrap_or((v, 1.0));
    let x: f64 = num.trim().parse().ok()?;
    (x >= 0.0 && x.is_finite()).then_some(x * scale)
}

/// A number as the library reads it (no exponent).
fn a_value(x: f64) -> String {
    if x.fract() == 0.0 {
        format!("{x:.0}")
    } else {
        format!("{x}")
    }
}

/// The program `name` runs: itself if it names a path, else the first
/// executable of that name on `PATH`.
fn resolve(name: &std::ffi::OsStr) -> Option<PathBuf> {
    let p = Path::new(name);
    if p.components().count() > 1 {
        return Some(p.to_path_buf());
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(p))
        .find(|c| c.is_file())
}

/// A note for a program the runtime would find no probe in: it would run
/// and write nothing. `None` for an instrumented program, and for one that
/// cannot be read as ELF (a script: what it runs may be instrumented).
pub fn no_probes_note(program: &std::ffi::OsStr) -> Option<String> {
    let path = resolve(program)?;
    let bytes = std::fs::read(&path).ok()?;
    let build = providers::offline::probe_build(&bytes).ok()?;
    (!build.any()).then(|| {
        format!(
            "fastinst: {} has no probe sites (no -finstrument-functions hook calls, no \
             -fpatchable-function-entry sleds, no -pg profiling calls, no XRay sleds, no Rust \
             probes), so only libraries it loads that have them are probed; build it with \
             `gcc -O2 -finstrument-functions`, `-fpatchable-function-entry=5` or `-pg -mfentry`, \
             or use #[fastinst::instrument] in Rust (`fastinst sites FILE` lists what a build has)",
            path.display()
        )
    })
}

/// Runs it; returns the exit status to pass on.
pub fn run(r: &RunArgs) -> Result<u8> {
    let (mut cmd, out_dir) = command(r)?;
    let mut child = cmd.spawn().map_err(|source| CliError::Spawn {
        program: r.command[0].clone().into(),
        source,
    })?;
    let pid = child.id();
    // Ctrl-C and Ctrl-\ reach the whole foreground group: the program decides
    // what they mean, and this process waits to pass on its status (as
    // system(3) does). Set after the spawn, so the program keeps the default
    // dispositions.
    ignore_terminal_signals();
    let status = child.wait().map_err(CliError::io(&r.command[0]))?;
    if r.print {
        print_report(&out_dir, &r.tool, pid);
    }
    Ok(exit_status(status))
}

/// The status to pass on for a child's `status`: its code, or 128 + the
/// signal that ended it.
pub(crate) fn exit_status(status: std::process::ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(c), _) => c as u8,
        (None, Some(s)) => 128u8.wrapping_add(s as u8),
        (None, None) => 1,
    }
}

/// The program's command under the preload library with `r`'s settings,
/// and the directory its reports go to. Says first when the program has
/// no probe sites.
pub(crate) fn command(r: &RunArgs) -> Result<(Command, PathBuf)> {
    let lib = library::find(r.lib.as_deref())?;
    if let Some(note) = no_probes_note(std::ffi::OsStr::new(&r.command[0])) {
        eprintln!("{note}");
    }
    let mut cmd = Command::new(&r.command[0]);
    cmd.args(&r.command[1..]);
    let mut preload = OsString::from(lib.as_os_str());
    if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
        preload.push(":");
        preload.push(old);
    }
    cmd.env("LD_PRELOAD", preload);
    for (k, v) in &r.env {
        cmd.env(k, v);
    }
    let out_dir = match &r.out {
        Some(d) => {
            std::fs::create_dir_all(d).map_err(CliError::io(d))?;
            let abs = d.canonicalize().map_err(CliError::io(d))?;
            cmd.env("FASTINST_OUT", &abs);
            abs
        }
        None => match std::env::var_os("FASTINST_OUT") {
            Some(d) => PathBuf::from(d),
            None => PathBuf::from("."),
        },
    };
    Ok((cmd, out_dir))
}

pub(crate) fn ignore_terminal_signals() {
    for sig in [libc::SIGINT, libc::SIGQUIT] {
        // SAFETY: SIG_IGN installs no handler code; the process is single
        // threaded here apart from the waiting it is about to do.
        unsafe {
            libc::signal(sig, libc::SIG_IGN);
        }
    }
}

fn print_report(dir: &Path, tool: &str, pid: u32) {
    let name = match tool {
        "profile" => format!("fastinst-profile.{pid}.txt"),
        "count" => format!("fastinst-count.{pid}.txt"),
        "trace" => format!("fastinst-trace.{pid}.txt"),
        _ => return,
    };
    let path = dir.join(name);
    match std::fs::read_to_string(&path) {
        Ok(text) => eprint!("{text}"),
        Err(e) => eprintln!(
            "fastinst: no report at {} ({e}); was the program built with -finstrument-functions?",
            path.display()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn options_become_environment() {
        let r = parse(&v(&[
            "--tool=off",
            "--samples",
            "20",
            "--epoch-ms",
            "2.5",
            "--signal",
            "SIGUSR2",
            "--strategy",
            "paper",
            "--inlined",
            "./app",
            "-x",
            "--tool",
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(
            r.env,
            vec![
                ("FASTINST_TOOL", "off".to_string()),
                ("FASTINST_PROFILE_SAMPLES", "20".into()),
                ("FASTINST_PROFILE_EPOCH_MS", "2.5".into()),
                ("FASTINST_PROFILE_SIGNAL", "USR2".into()),
                ("FASTINST_STRATEGY", "paper".into()),
                ("FASTINST_INLINED", "1".into()),
            ]
        );
        assert_eq!(r.command, v(&["./app", "-x", "--tool"]));
    }

    #[test]
    fn durations_and_depths_become_environment() {
        for (d, us) in [
            ("250us", "250"),
            ("1.5ms", "1500"),
            ("2s", "2000000"),
            ("40", "40"),
            ("500ns", "0.5"),
        ] {
            let r = parse(&v(&["--min-duration", d, "./app"])).unwrap().unwrap();
            assert_eq!(r.env, vec![("FASTINST_MIN_DURATION_US", us.to_string())], "{d}");
        }
        let r = parse(&v(&["--depth", "3", "./app"])).unwrap().unwrap();
        assert_eq!(r.env, vec![("FASTINST_MAX_DEPTH", "3".to_string())]);
        let e = |a: &[&str]| parse(&v(a)).unwrap_err().to_string();
        assert!(e(&["--min-duration", "fast", "x"]).contains("not a duration"));
        assert!(e(&["--min-duration", "-1ms", "x"]).contains("not a duration"));
        assert!(e(&["--depth", "0", "x"]).contains("depth 1"));
    }

    #[test]
    fn bad_options_say_what_is_wrong() {
        let e = |a: &[&str]| parse(&v(a)).unwrap_err().to_string();
        assert_eq!(
            e(&["--tool", "tracing", "x"]),
            "fastinst run: --tool: `tracing` is not one of profile, count, trace, off, none"
        );
        assert_eq!(
            e(&["--samples", "1", "x"]),
            "fastinst run: --samples: at least 2 samples are needed to estimate a rate"
        );
        assert_eq!(e(&["--share", "0", "x"]), "fastinst run: --share: 0 is not in 1 to 90");
        assert_eq!(
            e(&["--share", "95", "x"]),
            "fastinst run: --share: 95 is not in 1 to 90"
        );
        assert!(e(&["--share", "half", "x"]).contains("--share"));
        let r = parse(&v(&["--share", "15", "x"])).unwrap().unwrap();
        assert_eq!(r.env, vec![("FASTINST_PROFILE_SHARE", "15".to_string())]);
        assert!(e(&["--bogus", "x"]).contains("unknown option --bogus"));
        assert!(e(&["--tool", "off"]).contains("no program to run"));
        assert!(e(&["--client", "/nonexistent/c.so", "x"]).starts_with("/nonexistent/c.so: "));
        assert!(parse(&v(&["--help"])).unwrap().is_none());
    }
}
