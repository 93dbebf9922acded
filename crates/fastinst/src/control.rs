//! The control socket: a Unix socket, mode 0600, that `fastinst attach`,
//! `fastinst top` and `fastinst ctl`-like clients talk to, one line per
//! connection and one line of answer:
//! - `status`: `ok attached <tool>` or `ok running <tool>`;
//! - `report`: the profiler writes its reports now; `ok <files>`;
//! - `snapshot`: the profiler's report as it stands, as one line of JSON
//!   (the schema of its `.json` file), written nowhere: `ok <json>`;
//! - `set KEY=VALUE ...`: changes the profiler's sampling settings from
//!   its next epoch (`samples`, `windows`, `epoch-ms`; all or none), `ok`
//!   and the settings as they now stand;
//! - `detach` (attached runs only), two lines: the sled watcher and the
//!   sampler thread end and every probe goes off, `ok off <tid>` (the
//!   thread answering, which goes on to write the reports); then the tool
//!   writes its reports, `ok <files>`, and the socket goes.
//!
//! An attached runtime serves it from [`crate::attach::start`]; a preloaded
//! one when its environment names a socket in `FASTINST_CONTROL` (what
//! `fastinst top` does), from [`serve_from_env`].

use crate::tools::Tool;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Binds the socket at `path` (replacing a stale one), owner-only.
pub(crate) fn bind(path: &Path) -> std::io::Result<UnixListener> {
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

/// Serves the socket of a preloaded runtime whose environment names one
/// (`FASTINST_CONTROL`), on a thread of its own; nothing when it names
/// none. Called by the preload library after the runtime started. A
/// socket that cannot be served is said on stderr, and the program runs
/// on without it.
pub fn serve_from_env() {
    let Some(path) = crate::env::env("FASTINST_CONTROL").map(PathBuf::from) else {
        return;
    };
    let _ = SERVED.set(path.clone());
    let spawned = bind(&path).and_then(|listener| {
        std::thread::Builder::new()
            .name("fastinst-control".into())
            .spawn(move || serve(listener, path.clone(), false))
            .map(drop)
    });
    if let Err(e) = spawned {
        crate::log::warn(format_args!("FASTINST_CONTROL: no control socket: {e}"));
    }
}

/// The socket [`serve_from_env`] serves, to remove at exit.
static SERVED: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// At the process's exit: removes the socket [`serve_from_env`] made (an
/// attached runtime's goes at its detach).
pub fn end() {
    if let Some(p) = SERVED.get() {
        let _ = std::fs::remove_file(p);
    }
}

fn take_written() -> String {
    let files = crate::attached::take_written();
    files
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Serves `listener` (bound at `path`) until a `detach` (`attached` runs)
/// or the process ends.
pub(crate) fn serve(listener: UnixListener, path: PathBuf, attached: bool) {
    for conn in listener.incoming() {
        let Ok(mut conn) = conn else { continue };
        let mut line = String::new();
        if BufReader::new(&conn).read_line(&mut line).is_err() {
            continue;
        }
        let profiling = crate::process::tool() == Tool::Profile;
        let (answer, done) = match line.trim() {
            "status" => (
                format!(
                    "ok {} {:?}",
                    if attached { "attached" } else { "running" },
                    crate::process::tool()
                ),
                false,
            ),
            "report" if profiling => {
                crate::profile::write_reports(true);
                (format!("ok {}", take_written()), false)
            }
            "snapshot" if profiling => match crate::profile::snapshot_json() {
                Some(json) => (format!("ok {json}"), false),
                None => ("error no probe yet".to_string(), false),
            },
            "report" | "snapshot" => ("error only the profiler reports on demand".to_string(), false),
            set if profiling && (set == "set" || set.starts_with("set ")) => {
                match crate::profile::set_settings(&set[3..]) {
                    Ok(now) => (format!("ok {now}"), false),
                    Err(e) => (format!("error {e}"), false),
                }
            }
            set if set == "set" || set.starts_with("set ") => {
                ("error only the profiler has settings to change".to_string(), false)
            }
            "detach" if attached => {
                // Two lines: the first once the tool has stopped and every
                // probe is off (the command puts the code back meanwhile,
                // and the program runs as before while the reports are
                // written), the second with the reports' files.
                let off = switch_off();
                // SAFETY: gettid has no preconditions.
                let tid = unsafe { libc::gettid() };
                let first = match &off {
                    Ok(()) => format!("ok off {tid}"),
                    Err(e) => format!("error {e}"),
                };
                let _ = writeln!(conn, "{first}");
                let _ = conn.flush();
                crate::process::finish();
                crate::attached::set(false);
                (
                    match off {
                        Ok(()) => format!("ok {}", take_written()),
                        Err(e) => format!("error {e}"),
                    },
                    true,
                )
            }
            "detach" => (
                "error not attached: the program was started under the runtime".to_string(),
                false,
            ),
            other => (
                format!("error unknown command `{other}` (status, report, snapshot, set, detach)"),
                false,
            ),
        };
        let _ = writeln!(conn, "{answer}");
        if done {
            break;
        }
    }
    let _ = std::fs::remove_file(path);
}

/// Ends the attached run, all but its reports: the sled watcher and the
/// sampler thread end, every CPU sample event closes, no tool sees a
/// probe again and every probe goes off (a sled back to its 5-byte NOP;
/// `fastinst attach` then puts the file's bytes back). The reports are
/// written next, from what was gathered.
fn switch_off() -> Result<(), String> {
    // First, so no library loaded from here on gets probes.
    crate::sled::stop_watching();
    let sampler_ended = crate::profile::end_for_detach(Duration::from_secs(2));
    crate::api::unlisten();
    let mut failed = 0;
    for p in crate::registry::iter() {
        if crate::deactivate(p.meta.id).is_err() {
            failed += 1;
        }
    }
    if !sampler_ended {
        return Err("the sampler thread did not end within 2 s".into());
    }
    if failed > 0 {
        return Err(format!("{failed} probes could not be switched off"));
    }
    Ok(())
}
