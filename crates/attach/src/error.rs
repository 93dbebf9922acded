//! What can stop an attach or a detach, each with what to do about it.

/// A failed attach or detach.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AttachError {
    /// No such process.
    #[error("no process {0}")]
    NoProcess(i32),
    /// The process belongs to another user.
    #[error("process {pid} belongs to user {owner}, not to you ({me}): attach as its owner")]
    NotOwner {
        /// The process.
        pid: i32,
        /// Its owner's uid.
        owner: u32,
        /// The caller's uid.
        me: u32,
    },
    /// ptrace was refused.
    #[error("cannot ptrace process {pid}: {errno}{hint}")]
    Ptrace {
        /// The process.
        pid: i32,
        /// The error.
        errno: nix::Error,
        /// What to do, from the Yama `ptrace_scope` setting where it is the
        /// reason.
        hint: String,
    },
    /// Another tracer (a debugger, or another `fastinst attach`) holds it.
    #[error("process {pid} is traced by process {tracer} already (a debugger, or another fastinst attach)")]
    Traced {
        /// The process.
        pid: i32,
        /// The tracer's pid.
        tracer: i32,
    },
    /// The runtime was preloaded into the process (`LD_PRELOAD`).
    #[error("process {0} runs the fastinst runtime preloaded (LD_PRELOAD), not attached: control it through the socket FASTINST_CONTROL names (see docs/attach.md)")]
    AlreadyLoaded(i32),
    /// The process is attached now.
    #[error("process {0} is attached already, by a `fastinst attach` that still runs: end that one first (Ctrl-C)")]
    AlreadyAttached(i32),
    /// The runtime loaded in the process is a file since replaced.
    #[error(
        "process {0} has a libfastinst.so loaded whose file was since replaced or removed: it cannot be attached again"
    )]
    StaleLibrary(i32),
    /// Nothing to probe.
    #[error("process {0} has no probe sites: build it with -fpatchable-function-entry=5 or -finstrument-functions (see docs/attach.md)")]
    NoSites(i32),
    /// The runtime library's file is named otherwise: the attach finds it
    /// in the process (loaded already, or just now) by its name.
    #[error("{0}: the runtime library's file must be named libfastinst.so (the attach finds it in the process by that name); copy or link it under that name")]
    LibraryName(std::path::PathBuf),
    /// The process ended.
    #[error("process {0} exited during the attach")]
    Exited(i32),
    /// A symbol the injection needs is missing.
    #[error("no `{symbol}` in {module}")]
    NoSymbol {
        /// The symbol.
        symbol: String,
        /// Where it was looked for.
        module: String,
    },
    /// The process's `dlopen` failed.
    #[error("the process could not load {library}: {message}")]
    Dlopen {
        /// The library.
        library: String,
        /// `dlerror()`'s message.
        message: String,
    },
    /// The runtime did not start.
    #[error("the runtime did not start in process {pid}: fastinst_attach_start returned {code} ({reason})")]
    Start {
        /// The process.
        pid: i32,
        /// Its status.
        code: i32,
        /// What the status means.
        reason: &'static str,
    },
    /// A thread did not come back from a call made in it.
    #[error("process {pid}: the call of {what} did not return within {secs} s; the thread was left running it")]
    Timeout {
        /// The process.
        pid: i32,
        /// The function called.
        what: String,
        /// The limit.
        secs: u64,
    },
    /// Reading or writing the process's memory or files failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being read or written.
        what: String,
        /// Why.
        source: std::io::Error,
    },
    /// A step of the protocol failed otherwise.
    #[error("{0}")]
    Other(String),
}

/// The result of an attach step.
pub type Result<T> = std::result::Result<T, AttachError>;

impl AttachError {
    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> AttachError {
        let what = what.into();
        move |source| AttachError::Io { what, source }
    }
}
