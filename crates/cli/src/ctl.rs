//! `fastinst ctl`: one command to a runtime's control socket, its answer
//! printed.

use crate::args::{Args, Item};
use crate::error::{CliError, Result};
use std::path::PathBuf;

/// Usage text.
pub const USAGE: &str = "\
usage: fastinst ctl (PID | --socket PATH) COMMAND

Sends COMMAND to the control socket of a runtime and prints its answer:
the socket of process PID while `fastinst attach` (or `fastinst top --pid`)
holds it, or PATH, the socket a program started with `fastinst run
--control PATH` serves. The exit status is 0 for an `ok` answer, 1 for an
`error`.

commands:
  status            the runtime and its tool
  report            the profiler writes its reports now; their files
  snapshot          the profile as it stands, as one line of JSON (the
                    .json report's schema)
  set KEY=VALUE...  changes the profiler's sampling settings from its next
                    epoch, all or none: samples=2..1000 (calls timed per
                    function an epoch), windows=1..64 (counting windows per
                    function an epoch), density=1..1000 (counting hooks per
                    1,000 ticks the open windows may run), share=1..90 (the
                    percent of the CPU time the profiler holds itself to),
                    epoch-ms=1..1000;
                    answers with the
                    settings as they now stand
  detach            only for `fastinst attach`'s socket, and only through
                    it: press Ctrl-C there (it also puts the sleds' bytes
                    back), so this one is refused here

options:
  --socket PATH     the socket, for a program run with --control PATH
  -h, --help        this text
";

/// A parsed `fastinst ctl`.
#[derive(Debug, PartialEq, Eq)]
pub struct CtlArgs {
    /// The socket.
    pub socket: Target,
    /// The command line to send.
    pub command: String,
}

/// Whose socket.
#[derive(Debug, PartialEq, Eq)]
pub enum Target {
    /// An attached process's.
    Pid(i32),
    /// A path.
    Path(PathBuf),
}

/// Parses the arguments; `None` for `--help`.
pub fn parse(argv: &[String]) -> Result<Option<CtlArgs>> {
    let mut a = Args::new("ctl", argv);
    let mut socket = None;
    let mut words = Vec::new();
    while let Some(item) = a.next_item() {
        match item {
            Item::Opt("-h" | "--help", _) => return Ok(None),
            Item::Opt(n @ "--socket", i) => socket = Some(Target::Path(a.value(n, i)?.into())),
            Item::Opt(other, _) => return Err(a.unknown(other)),
            Item::Positional(p) => words.push(p.to_string()),
            Item::EndOfOptions => words.extend(a.remaining().iter().cloned()),
        }
    }
    if socket.is_none() && !words.is_empty() {
        let p = words.remove(0);
        let pid = p
            .parse::<i32>()
            .ok()
            .filter(|&p| p > 0)
            .ok_or_else(|| a.usage(format!("`{p}` is not a process id (or give --socket PATH)")))?;
        socket = Some(Target::Pid(pid));
    }
    let socket = socket.ok_or_else(|| a.usage("give a process id or --socket PATH"))?;
    let command = match words.as_slice() {
        [c] if ["status", "report", "snapshot"].contains(&c.as_str()) => c.clone(),
        [c, kv @ ..] if c == "set" && !kv.is_empty() => {
            if let Some(w) = kv.iter().find(|w| !w.contains('=') || w.contains(char::is_whitespace)) {
                return Err(a.usage(format!("set: `{w}` is not KEY=VALUE")));
            }
            format!("set {}", kv.join(" "))
        }
        [c] if c == "set" => return Err(a.usage("set: give KEY=VALUE (samples, windows, epoch-ms)")),
        [c] if c == "detach" => {
            return Err(a.usage("detach: press Ctrl-C at `fastinst attach`, which also puts the sleds' bytes back"))
        }
        [c] => return Err(a.usage(format!("`{c}` is not a command (status, report, snapshot, set)"))),
        _ => return Err(a.usage("give one command (status, report, snapshot, set KEY=VALUE...)")),
    };
    Ok(Some(CtlArgs { socket, command }))
}

/// Sends the command and prints the answer; returns the exit status.
pub fn run(c: &CtlArgs) -> Result<u8> {
    let path = match &c.socket {
        Target::Path(p) => p.clone(),
        Target::Pid(pid) => fastinst_attach::control_socket(*pid).ok_or_else(|| {
            CliError::Attach(format!(
                "process {pid} has no control socket: it is not attached (fastinst attach PID, or fastinst top --pid PID)"
            ))
        })?,
    };
    let answer = fastinst_attach::control(&path, &c.command).map_err(|e| CliError::Attach(e.to_string()))?;
    crate::print_out(&format!("{answer}\n"))?;
    Ok(if answer.starts_with("ok") { 0 } else { 1 })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_process_or_a_socket_and_one_command() {
        assert_eq!(
            parse(&args(&["42", "status"])).unwrap().unwrap(),
            CtlArgs {
                socket: Target::Pid(42),
                command: "status".into()
            }
        );
        assert_eq!(
            parse(&args(&["--socket", "/s", "snapshot"])).unwrap().unwrap().socket,
            Target::Path("/s".into())
        );
        assert_eq!(
            parse(&args(&["42", "set", "samples=40", "epoch-ms=5"]))
                .unwrap()
                .unwrap()
                .command,
            "set samples=40 epoch-ms=5"
        );
        for (a, why) in [
            (&["42", "set"][..], "KEY=VALUE"),
            (&["42", "set", "samples"], "not KEY=VALUE"),
            (&["42"][..], "one command"),
            (&["x", "status"], "not a process id"),
            (&["42", "detach"], "Ctrl-C"),
            (&["42", "reboot"], "not a command"),
            (&[], "process id or --socket"),
        ] {
            let e = parse(&args(a)).unwrap_err().to_string();
            assert!(e.contains(why), "{a:?}: {e}");
        }
    }
}
