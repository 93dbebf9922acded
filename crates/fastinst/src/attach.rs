//! The runtime inside a process it was attached to (`fastinst attach PID`),
//! not preloaded into.
//!
//! The `fastinst-attach` crate stops the process's threads with ptrace,
//! rewrites its gcc sleds to 5-byte NOPs, writes a settings file
//! ([`config_path`]) and makes one of its threads call `dlopen` on
//! `libfastinst.so` and then `fastinst_attach_start` with that file, which
//! ends here, in [`start`]. The library's constructor sees the file and
//! leaves the starting to that call.
//!
//! The settings file holds `KEY=VALUE` lines: the `FASTINST_*` variables
//! the process was not started with (read in place of its environment,
//! which is never written: `setenv` races every other thread's `getenv`),
//! and `FASTINST_CONTROL`, the path of the control socket
//! ([`crate::control`]) it then serves.
//!
//! Libraries the process loads while attached are probed: the sled
//! watcher registers their sleds and points their `-finstrument-functions`
//! hook slots at the runtime's hooks (`hookbind`).
//!
//! What stays behind after a detach: the mapped library, its trampoline
//! pages and its idle state. Calls that were being timed when the tool
//! stopped still return through the library's exit trampoline, which pairs
//! them and returns as before; nothing calls into the library otherwise.
//!
//! A process can be attached again once detached, any number of times. The
//! library is loaded once; each attach after the first starts the runtime
//! again ([`start`]) with that attach's settings: the modules, sleds and
//! probes read before are kept, and the tool starts afresh (the profiler
//! as a new generation, its reports only of that attach's time; the
//! counts from zero). Each attach leaves one more idle profiler behind
//! (its tables, not freed because nothing proves no thread still holds a
//! reference). The trace tool runs once a process. A process started
//! under `LD_PRELOAD` is never attached ([`AttachError::AlreadyStarted`]).

use std::path::{Path, PathBuf};

/// Why an attached start failed: also `fastinst_attach_start`'s status
/// ([`AttachError::code`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AttachError {
    /// The settings file could not be read.
    #[error("cannot read the settings file {0}: {1}")]
    Config(PathBuf, std::io::Error),
    /// The runtime was started already (preloaded, or attached before).
    #[error("the runtime was started in this process already")]
    AlreadyStarted,
    /// The control socket could not be made.
    #[error("cannot serve the control socket {0}: {1}")]
    Control(PathBuf, std::io::Error),
    /// The settings name no control socket.
    #[error("the settings name no FASTINST_CONTROL socket")]
    NoControl,
    /// The tool could not start (in an attach after a detach: the trace
    /// tool, which runs once a process).
    #[error("the tool could not start: {0}")]
    Tool(crate::Error),
}

impl AttachError {
    /// The status `fastinst_attach_start` returns for it (0 is success).
    pub fn code(&self) -> i32 {
        match self {
            AttachError::Config(..) => 1,
            AttachError::AlreadyStarted => 2,
            AttachError::Control(..) => 3,
            AttachError::NoControl => 4,
            AttachError::Tool(_) => 5,
        }
    }
}

/// Whether the runtime was started by an attach (and has not been
/// detached): reports then go to files only, never to the program's
/// stderr.
pub fn attached() -> bool {
    crate::attached::get()
}

/// Where `fastinst attach` writes the settings for process `pid` of user
/// `uid`: in `/tmp/fastinst-<uid>/`, a directory only its owner can
/// enter.
pub fn config_path(uid: u32, pid: u32) -> PathBuf {
    PathBuf::from(format!("/tmp/fastinst-{uid}/attach-{pid}.conf"))
}

/// Whether an attach of this process is under way: its settings file is
/// there (the library's constructor then starts nothing itself).
pub fn pending() -> bool {
    // SAFETY: getuid and getpid cannot fail.
    let (uid, pid) = unsafe { (libc::getuid(), libc::getpid()) };
    config_path(uid, pid as u32).exists()
}

/// Parses a settings file's `KEY=VALUE` lines (blank lines and `#`
/// comments skipped).
fn parse_config(text: &str) -> Vec<(String, String)> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.to_string()))
        .collect()
}

/// Starts the runtime from the settings file `config` and serves the
/// control socket it names. The tool starts as under `LD_PRELOAD`
/// ([`crate::process::start_from_env`]), with the file's settings for
/// environment.
pub fn start(config: &Path) -> Result<(), AttachError> {
    let text = std::fs::read_to_string(config).map_err(|e| AttachError::Config(config.into(), e))?;
    let vars = parse_config(&text);
    let control = vars
        .iter()
        .find(|(k, _)| k == "FASTINST_CONTROL")
        .map(|(_, v)| PathBuf::from(v))
        .ok_or(AttachError::NoControl)?;
    // Started, and not by an attach that was since detached: preloaded, or
    // attached now.
    // An attach's settings stand for the environment: a runtime that has
    // them was started by an attach.
    let again = crate::env::has_overlay() && !attached();
    if crate::process::started() && !again {
        return Err(AttachError::AlreadyStarted);
    }
    if crate::process::started()
        && crate::process::tool_from(&vars) == crate::tools::Tool::Trace
        && crate::trace::installed()
    {
        return Err(AttachError::Tool(crate::Error::InvalidArgument(
            "the trace tool runs once in a process".into(),
        )));
    }
    if crate::process::started() {
        // Attached before: the detach put every probed byte of code back
        // to its file's, and this attach normalised the sleds again.
        let differing = crate::toggle::resync_after_restore();
        if differing > 0 {
            crate::log::warn(format_args!(
                "{differing} probe sites hold neither their file's bytes nor a form of the runtime's"
            ));
        }
    }
    crate::env::set_overlay(vars);
    let listener = crate::control::bind(&control).map_err(|e| AttachError::Control(control.clone(), e))?;
    crate::attached::set(true);
    crate::process::start_from_env();
    // The program's `dlopen` calls were bound before this library came,
    // so none reaches the preload's interposed one: libraries it loads
    // while attached are found by the watcher, ended at the detach.
    crate::hookbind::mark_mapped();
    crate::sled::watch_with(modules_loaded);
    std::thread::Builder::new()
        .name("fastinst-control".into())
        .spawn(move || crate::control::serve(listener, control, true))
        .map_err(|e| AttachError::Control(PathBuf::new(), e))?;
    Ok(())
}

/// The watcher's answer to modules loaded while attached: their sleds
/// registered, their hook slots bound.
fn modules_loaded() {
    crate::sled::load();
    crate::hookbind::bind_new();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_lines_are_read_as_variables() {
        let v = parse_config("# made by fastinst attach\nFASTINST_TOOL=profile\n\nFASTINST_OUT=/a=b\n  junk\n");
        assert_eq!(
            v,
            vec![
                ("FASTINST_TOOL".to_string(), "profile".to_string()),
                ("FASTINST_OUT".to_string(), "/a=b".to_string())
            ]
        );
    }

    #[test]
    fn the_settings_file_is_named_by_user_and_process() {
        assert_eq!(
            config_path(1000, 42),
            PathBuf::from("/tmp/fastinst-1000/attach-42.conf")
        );
    }
}
