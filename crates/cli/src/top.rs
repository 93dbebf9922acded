//! `fastinst top`: a live view of a program under the profiler, refreshed
//! in the terminal: its functions by total time, with calls, self time,
//! p50 and p99, like `py-spy top`.
//!
//! The program runs as under `fastinst run`, with `FASTINST_CONTROL`
//! naming a socket in a directory only this user can enter; every
//! interval the view asks the runtime for a `snapshot` (the profile as it
//! stands, as JSON: see `fastinst::control`) and draws it. The program's
//! own output goes to a log file, so that it does not tear the table; the
//! reports are written at its exit as usual.

use crate::args::{Args, Item};
use crate::attach;
use crate::error::{CliError, Result};
use crate::run::{self, RunArgs};
use fastinst_report::Report;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Usage text.
pub const USAGE: &str = "\
usage: fastinst top [--interval S] [--rows N] [run options] [--] PROGRAM [ARGS...]
       fastinst top --pid PID [--duration S] [--interval S] [--rows N] [attach options]

Runs PROGRAM under the latency profiler, as `fastinst run` does, or
attaches to running process PID, as `fastinst attach` does, and shows its
functions live, refreshed every S seconds: calls (estimated, or = when
exact), total (inclusive) and self time so far, p50 and p99 of the timed
calls, heaviest total first. PROGRAM's stdout and stderr go to
fastinst-top.<pid>.log in the reports' directory, and its reports are
written at its exit; PID is detached at Ctrl-C or after --duration, its
reports written then. The last table stays on the screen.

options:
  --interval S      seconds between refreshes (default 1; at least 0.05)
  --rows N          functions shown (default 20)
  --pid PID         a running process (a sled build), not a program to run
  --duration S      with --pid: seconds to stay attached (default: until
                    Ctrl-C)
  run options       as for `fastinst run` or `fastinst attach` (--out,
                    --functions, --samples, ...); the tool is the profiler
  -h, --help        this text
";

/// A parsed `fastinst top`.
#[derive(Debug)]
pub struct TopArgs {
    /// The program (none with `--pid`) and the runtime's settings, as for
    /// `fastinst run`.
    pub run: RunArgs,
    /// `--pid`: a running process to attach to.
    pub pid: Option<i32>,
    /// `--duration`, with `--pid`.
    pub duration: Option<Duration>,
    /// Time between refreshes.
    pub interval: Duration,
    /// Functions shown.
    pub rows: usize,
}

/// Parses the arguments of `fastinst top`; `None` for `--help`.
pub fn parse(argv: &[String]) -> Result<Option<TopArgs>> {
    let mut a = Args::new("top", argv);
    let mut interval = Duration::from_secs(1);
    let mut rows = 20;
    let mut pid: Option<String> = None;
    let mut duration: Option<String> = None;
    let mut rest: Vec<String> = Vec::new();
    while let Some(item) = a.next_item() {
        match item {
            Item::Opt("-h" | "--help", _) => return Ok(None),
            Item::Opt(n @ "--interval", i) => {
                let s: f64 = a.parsed(n, i, "a number of seconds")?;
                if !(s >= 0.05 && s.is_finite()) {
                    return Err(a.usage(format!("{n}: {s} s is less than 0.05 s")));
                }
                interval = Duration::from_secs_f64(s);
            }
            Item::Opt(n @ "--rows", i) => {
                rows = a.parsed(n, i, "a whole number")?;
                if rows == 0 {
                    return Err(a.usage(format!("{n}: at least one row")));
                }
            }
            Item::Opt(n @ "--control", _) => {
                return Err(a.usage(format!("{n}: top serves its own control socket")));
            }
            Item::Opt(n @ "--pid", i) => pid = Some(a.value(n, i)?.to_string()),
            Item::Opt(n @ "--duration", i) => duration = Some(a.value(n, i)?.to_string()),
            Item::Opt(name, i) => {
                rest.push(name.to_string());
                if i.is_some() || takes_value(name) {
                    rest.push(a.value(name, i)?.to_string());
                }
            }
            Item::Positional(p) => {
                rest.push("--".into());
                rest.push(p.to_string());
                rest.extend(a.remaining().iter().cloned());
                break;
            }
            Item::EndOfOptions => {
                rest.push("--".into());
                rest.extend(a.remaining().iter().cloned());
                break;
            }
        }
    }
    let retitle = |e: CliError| match e {
        CliError::Usage(m) => CliError::Usage(m.replacen("fastinst run", "fastinst top", 1).replacen(
            "fastinst attach",
            "fastinst top",
            1,
        )),
        e => e,
    };
    let (r, pid, duration) = match pid {
        Some(p) => {
            if rest.iter().any(|x| x == "--") {
                return Err(a.usage("--pid: a running process, or a program to run, not both"));
            }
            rest.push(p);
            if let Some(d) = duration {
                rest.extend(["--duration".to_string(), d]);
            }
            let Some(at) = attach::parse(&rest).map_err(retitle)? else {
                return Ok(None);
            };
            (at.run, Some(at.pid), at.duration)
        }
        None => {
            if duration.is_some() {
                return Err(a.usage("--duration: only with --pid (a program runs to its end)"));
            }
            let Some(r) = run::parse(&rest).map_err(retitle)? else {
                return Ok(None);
            };
            (r, None, None)
        }
    };
    if r.tool != "profile" {
        return Err(a.usage(format!("--tool {}: top shows the profiler's view only", r.tool)));
    }
    Ok(Some(TopArgs {
        run: r,
        pid,
        duration,
        interval,
        rows,
    }))
}

/// The `fastinst run` options that take a value (passed on to its parser).
fn takes_value(name: &str) -> bool {
    matches!(
        name,
        "--tool"
            | "--out"
            | "--samples"
            | "--epoch-ms"
            | "--windows"
            | "--density"
            | "--share"
            | "--functions"
            | "--exclude"
            | "--modules"
            | "--min-duration"
            | "--depth"
            | "--signal"
            | "--strategy"
            | "--lib"
            | "--client"
            | "--log"
    )
}

/// Runs the program (or attaches to the process) and the view; returns
/// the program's exit status (0 for an attached process).
pub fn run(t: &TopArgs) -> Result<u8> {
    match t.pid {
        Some(pid) => run_attached(t, pid),
        None => run_program(t),
    }
}

/// One refresh: the frame to draw from a snapshot at `socket`, and the new
/// last table. A failed snapshot keeps the last table, marked.
fn frame(socket: &Path, rows: usize, label: &str, last: &mut Option<String>) -> String {
    match snapshot(socket) {
        Ok(r) => {
            let table = render(&r, rows);
            *last = Some(table.clone());
            table
        }
        Err(why) => match last {
            Some(table) => format!("{table}\n(not refreshed: {why})\n"),
            None => format!("fastinst top: {label}: {why}\n"),
        },
    }
}

/// Draws `frame`: the screen cleared first on a terminal.
fn draw(frame: &str, tty: bool) {
    let mut out = std::io::stdout().lock();
    // The view is best effort: a closed terminal stops neither the program
    // nor the detach.
    let _ = write!(out, "{}{frame}", if tty { "\x1b[H\x1b[2J" } else { "\n" });
    let _ = out.flush();
}

fn is_tty() -> bool {
    // SAFETY: isatty only reads the descriptor's state.
    unsafe { libc::isatty(1) == 1 }
}

/// `fastinst top --pid`: attaches, redraws until Ctrl-C, --duration or the
/// process's exit, and detaches.
fn run_attached(t: &TopArgs, pid: i32) -> Result<u8> {
    attach::catch_interrupt();
    let session = attach::begin(pid, &t.run)?;
    let (tty, began, label) = (is_tty(), std::time::Instant::now(), format!("process {pid}"));
    let mut last = None;
    while !attach::interrupted() && t.duration.is_none_or(|d| began.elapsed() < d) {
        std::thread::sleep(t.interval);
        if !attach::alive(pid) {
            println!("\nfastinst top: process {pid} exited while attached; its reports were written at its exit");
            return Ok(0);
        }
        draw(&frame(session.control_path(), t.rows, &label, &mut last), tty);
    }
    println!();
    attach::end(pid, session)?;
    Ok(0)
}

/// `fastinst top -- PROGRAM`: runs it with a control socket and redraws
/// until it exits.
fn run_program(t: &TopArgs) -> Result<u8> {
    // SAFETY: getuid and getpid cannot fail.
    let (uid, me) = unsafe { (libc::getuid(), libc::getpid()) };
    let dir = PathBuf::from(format!("/tmp/fastinst-{uid}/top-{me}"));
    std::fs::create_dir_all(&dir).map_err(CliError::io(&dir))?;
    for d in [dir.parent().expect("a parent"), &dir] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700)).map_err(CliError::io(d))?;
    }
    let socket = dir.join("control");
    let (mut cmd, out_dir) = run::command(&t.run)?;
    let log_path = out_dir.join(format!("fastinst-top.{me}.log"));
    let log = std::fs::File::create(&log_path).map_err(CliError::io(&log_path))?;
    let log2 = log.try_clone().map_err(CliError::io(&log_path))?;
    cmd.env("FASTINST_CONTROL", &socket).stdout(log).stderr(log2);
    let mut child = cmd.spawn().map_err(|source| CliError::Spawn {
        program: t.run.command[0].clone().into(),
        source,
    })?;
    let pid = child.id();
    run::ignore_terminal_signals();
    let tty = is_tty();
    let label = format!("{} (pid {pid})", t.run.command[0]);
    // The last table drawn from a snapshot.
    let mut last: Option<String> = None;
    let status = loop {
        if let Some(st) = child.try_wait().map_err(CliError::io(&t.run.command[0]))? {
            break st;
        }
        std::thread::sleep(t.interval);
        // The program may have ended meanwhile, its socket with it: the
        // last table stays on the screen.
        if let Some(st) = child.try_wait().map_err(CliError::io(&t.run.command[0]))? {
            break st;
        }
        draw(&frame(&socket, t.rows, &label, &mut last), tty);
    };
    let code = run::exit_status(status);
    let _ = std::fs::remove_dir_all(&dir);
    let mut out = std::io::stdout().lock();
    if last.is_none() {
        let _ = writeln!(out, "fastinst top: {} ended before the first refresh", t.run.command[0]);
    }
    let _ = writeln!(
        out,
        "\n{} (pid {pid}) exited with status {code}; its output: {}; reports: {}",
        t.run.command[0],
        log_path.display(),
        out_dir.join(format!("fastinst-profile.{pid}.*")).display()
    );
    Ok(code)
}

/// The profile as it stands, from the runtime's control socket.
fn snapshot(socket: &Path) -> std::result::Result<Report, String> {
    let mut s = UnixStream::connect(socket).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => "starting".to_string(),
        _ => format!("control socket: {e}"),
    })?;
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    writeln!(s, "snapshot").map_err(|e| e.to_string())?;
    let mut line = String::new();
    BufReader::new(&s).read_line(&mut line).map_err(|e| e.to_string())?;
    match line.trim_end().split_once(' ') {
        Some(("ok", json)) => serde_json::from_str(json).map_err(|e| format!("unreadable snapshot: {e}")),
        Some(("error", why)) => Err(why.to_string()),
        _ => Err(format!("unexpected answer `{}`", line.trim_end())),
    }
}

/// One frame of the view: a header and the `rows` functions with the
/// heaviest total time.
pub fn render(r: &Report, rows: usize) -> String {
    let mut f: Vec<&fastinst_report::FunctionRow> = r.functions.iter().collect();
    f.sort_by(|a, b| b.total_ms.total_cmp(&a.total_ms).then(a.name.cmp(&b.name)));
    let mut s = format!(
        "fastinst top: {} (pid {}), {:.1} s profiled, {} functions, {} samples\n\n",
        r.program,
        r.pid,
        r.wall_ms / 1e3,
        r.functions.len(),
        r.overhead.samples
    );
    s.push_str("       calls        +-    total ms     self ms     p50 us     p99 us  function\n");
    for x in f.iter().take(rows) {
        let sd = if x.calls_exact {
            "=".to_string()
        } else {
            format!("{:.0}", x.calls_sd)
        };
        // `?`: the percentile's range reaches past 10% of it, as in the
        // text report.
        s.push_str(&format!(
            "{:>12.0} {:>9} {:>11.3} {:>11.3} {:>9.2}{} {:>9.2}{}  {}\n",
            x.calls_estimated,
            sd,
            x.total_ms,
            x.self_ms,
            x.p50_us,
            fastinst_report::percentile_mark(x.p50_us, x.p50_range),
            x.p99_us,
            fastinst_report::percentile_mark(x.p99_us, x.p99_range),
            x.name
        ));
    }
    if f.len() > rows {
        s.push_str(&format!("  ... {} more\n", f.len() - rows));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn its_own_options_and_runs_options_are_told_apart() {
        let t = parse(&args(&[
            "--interval",
            "0.5",
            "--samples",
            "20",
            "--rows=3",
            "--",
            "./app",
            "-x",
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(t.interval, Duration::from_millis(500));
        assert_eq!(t.rows, 3);
        assert_eq!(t.run.command, ["./app", "-x"]);
        assert!(
            t.run
                .env
                .iter()
                .any(|(k, v)| *k == "FASTINST_PROFILE_SAMPLES" && v == "20"),
            "{:?}",
            t.run.env
        );
        let t = parse(&args(&["./app", "--interval", "9"])).unwrap().unwrap();
        assert_eq!(
            t.run.command,
            ["./app", "--interval", "9"],
            "after the program, its own"
        );
        assert!(parse(&args(&["--help"])).unwrap().is_none());
        let t = parse(&args(&["--pid", "42", "--duration", "2", "--samples", "5"]))
            .unwrap()
            .unwrap();
        assert_eq!((t.pid, t.duration), (Some(42), Some(Duration::from_secs(2))));
        assert!(t.run.command.is_empty());
    }

    /// A percentile known to within 10% is shown plain; one whose range
    /// is wider, or unbounded, is marked, as in the text report.
    #[test]
    fn uncertain_percentiles_are_marked() {
        use fastinst_report::{FunctionRow, Range};
        let row = FunctionRow {
            name: "handle".into(),
            total_ms: 1.0,
            p50_us: 2.0,
            p50_range: Some(Range { lo: 1.9, hi: Some(2.1) }),
            p99_us: 180.0,
            p99_range: Some(Range { lo: 20.0, hi: None }),
            ..Default::default()
        };
        let r = Report {
            functions: vec![row],
            ..Default::default()
        };
        let screen = render(&r, 10);
        let line = screen.lines().find(|l| l.ends_with(" handle")).unwrap();
        assert!(line.contains("2.00 ") && line.contains("180.00?"), "{screen}");
    }

    #[test]
    fn bad_settings_are_refused_with_the_reason() {
        for (a, why) in [
            (&["--interval", "0", "./app"][..], "less than 0.05"),
            (&["--rows", "0", "./app"], "at least one row"),
            (&["--tool", "count", "./app"], "profiler's view only"),
            (&[], "no program"),
            (&["--pid", "42", "--", "./app"], "not both"),
            (&["--duration", "2", "./app"], "only with --pid"),
            (&["--pid", "x"], "not a process id"),
        ] {
            let e = parse(&args(a)).unwrap_err().to_string();
            assert!(e.contains(why), "{a:?}: {e}");
        }
    }
}
