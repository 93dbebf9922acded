//! `fastinst attach`: the profiler (or another tool) in a process that is
//! already running, for a while, then detached (`fastinst-attach`).

use crate::args::{Args, Item};
use crate::error::{CliError, Result};
use crate::{library, run};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// `eprintln!` that cannot panic: with stderr closed (a pipe whose reader
/// went), `eprintln!` panics, and a panic between the attach and the
/// detach would leave the process attached.
macro_rules! say {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($t)*);
    }};
}

/// Usage text.
pub const USAGE: &str = "\
usage: fastinst attach [options] PID

Loads libfastinst.so into running process PID (built with
-fpatchable-function-entry=5) with ptrace, profiles it for --duration
seconds or until Ctrl-C, writes the reports, and detaches: every sled gets
its file's bytes back (checked), and the process runs on. The process's
output is its own: nothing is written to its stdout or stderr. See
docs/attach.md.

options:
  --duration S      seconds to stay attached (default: until Ctrl-C)
  and those of `fastinst run` that configure the runtime: --tool, --out,
  --samples, --epoch-ms, --windows, --density, --share, --no-cpu,
  --functions, --exclude, --modules, --min-duration, --depth, --inlined,
  --strategy, --log, --lib
  (not --signal, --client or --print)
  --no-wx           patch code in place (pages read+write+execute) instead
                    of through a writable alias (W^X, the default here)
  -h, --help        this text
";

/// A parsed `fastinst attach`.
#[derive(Debug, PartialEq)]
pub struct AttachArgs {
    /// The process.
    pub pid: i32,
    /// How long to stay; `None`: until Ctrl-C.
    pub duration: Option<Duration>,
    /// The runtime's settings and library, as `fastinst run` reads them.
    pub run: run::RunArgs,
}

/// Parses the arguments; `None` for `--help`.
pub fn parse(argv: &[String]) -> Result<Option<AttachArgs>> {
    let mut a = Args::new("attach", argv);
    let mut run = run::RunArgs {
        tool: "profile".into(),
        ..run::RunArgs::default()
    };
    let mut duration = None;
    let mut pid = None;
    while let Some(item) = a.next_item() {
        match item {
            Item::Opt("-h" | "--help", _) => return Ok(None),
            Item::Opt(n @ "--duration", i) => {
                let s: f64 = a.parsed(n, i, "a number of seconds")?;
                if !(s > 0.0 && s.is_finite()) {
                    return Err(a.usage(format!("{n}: the time must be positive")));
                }
                duration = Some(Duration::from_secs_f64(s));
            }
            Item::Opt(n @ "--control", _) => {
                return Err(a.usage(format!(
                    "{n}: an attached runtime serves its own socket (`fastinst ctl PID ...` talks to it)"
                )))
            }
            Item::Opt(n @ ("--signal" | "--client" | "--print"), _) => {
                return Err(a.usage(format!(
                    "{n} is not for a running process (a signal handler or a client would stay after the detach)"
                )))
            }
            Item::Opt(other, i) => {
                if !run::runtime_option(&mut a, other, i, &mut run)? {
                    return Err(a.unknown(other));
                }
            }
            Item::Positional(p) if pid.is_none() => {
                pid = Some(
                    p.parse::<i32>()
                        .ok()
                        .filter(|&p| p > 0)
                        .ok_or_else(|| a.usage(format!("`{p}` is not a process id")))?,
                );
            }
            Item::Positional(_) | Item::EndOfOptions => return Err(a.usage("give one process id")),
        }
    }
    let pid = pid.ok_or_else(|| a.usage("give one process id"))?;
    Ok(Some(AttachArgs { pid, duration, run }))
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_interrupt(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::Relaxed);
}

/// From now on Ctrl-C ends the attach (see [`interrupted`]) instead of
/// this process.
pub(crate) fn catch_interrupt() {
    let handler = nix::sys::signal::SigHandler::Handler(on_interrupt);
    // SAFETY: the handler stores to an atomic, which is async-signal-safe.
    let _ = unsafe { nix::sys::signal::signal(nix::sys::signal::Signal::SIGINT, handler) };
}

/// Whether Ctrl-C was pressed since [`catch_interrupt`].
pub(crate) fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::Relaxed)
}

/// Whether process `pid` is still there.
pub(crate) fn alive(pid: i32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// Attaches to `pid` with `run`'s settings; says so on stderr.
pub(crate) fn begin(pid: i32, run: &run::RunArgs) -> Result<fastinst_attach::Session> {
    let lib = library::find(run.lib.as_deref())?;
    let out = match &run.out {
        Some(o) => {
            std::fs::create_dir_all(o).map_err(CliError::io(o))?;
            o.canonicalize().map_err(CliError::io(o))?
        }
        None => std::env::current_dir().map_err(CliError::io("."))?,
    };
    let mut settings: Vec<(String, String)> = run.env.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
    settings.push(("FASTINST_OUT".into(), out.display().to_string()));
    // W^X unless asked otherwise (`--no-wx`): an attached service's code
    // pages are never writable and executable at once.
    if !settings.iter().any(|(k, _)| k == "FASTINST_WX") {
        settings.push(("FASTINST_WX".into(), "1".into()));
    }
    let session = crate::progress::step(&format!("attaching to {pid}"), || {
        fastinst_attach::attach(pid, &fastinst_attach::Options { library: lib, settings })
    })
    .map_err(|e| CliError::Attach(e.to_string()))?;
    let t = &session.timings;
    if t.recovered {
        say!("fastinst: {pid} was left attached by a `fastinst attach` that was killed: detached it first (its reports are in its --out)");
    }
    say!(
        "fastinst: attached to {} in {:.1} ms ({} threads stopped for {:.2} ms; {} sled sites, {} made one instruction; {} -finstrument-functions hook slots bound; files read and code checked in {:.1} ms, library loaded in {:.1} ms, runtime started in {:.1} ms)",
        pid,
        t.total.as_secs_f64() * 1e3,
        t.threads,
        t.all_stopped.as_secs_f64() * 1e3,
        t.sites,
        t.normalised,
        t.slots,
        t.prepared.as_secs_f64() * 1e3,
        t.loaded.as_secs_f64() * 1e3,
        t.started.as_secs_f64() * 1e3
    );
    Ok(session)
}

/// Detaches `session` from `pid`; says what it did on stderr.
pub(crate) fn end(pid: i32, session: fastinst_attach::Session) -> Result<()> {
    let d = crate::progress::step(&format!("detaching from {pid}"), || session.detach())
        .map_err(|e| CliError::Attach(e.to_string()))?;
    say!(
        "fastinst: detached from {} in {:.1} ms, released after {:.1} ms (threads stopped {:.2} ms; {} sites checked equal to their files{}; {} hook slots and {} runs of code put back, {} bytes of code checked)",
        pid,
        d.total.as_secs_f64() * 1e3,
        d.released.as_secs_f64() * 1e3,
        d.all_stopped.as_secs_f64() * 1e3,
        d.sites_checked,
        if d.late_sites + d.late_slots > 0 {
            format!(
                ", {} of them in libraries loaded while attached, and {} hook slots",
                d.late_sites, d.late_slots
            )
        } else {
            String::new()
        },
        d.slots_restored,
        d.code_restored,
        d.code_checked
    );
    if let Some(first) = d.files.first() {
        let rest: Vec<String> = d.files[1..].iter().map(|p| p.display().to_string()).collect();
        say!(
            "fastinst: reports written to {} (also {})",
            first.display(),
            rest.join(", ")
        );
    }
    Ok(())
}

/// Attaches, waits, detaches; says what it did on stderr.
pub fn run(a: &AttachArgs) -> Result<()> {
    catch_interrupt();
    let session = begin(a.pid, &a.run)?;
    let began = Instant::now();
    while !interrupted() && a.duration.is_none_or(|d| began.elapsed() < d) {
        if !alive(a.pid) {
            say!(
                "fastinst: process {} exited while attached; its reports were written at its exit",
                a.pid
            );
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    end(a.pid, session)
}
