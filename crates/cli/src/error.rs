//! What can go wrong, each naming the file or option concerned.

use std::path::PathBuf;

/// A failed command.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The command line itself is wrong (exit status 2).
    #[error("{0}")]
    Usage(String),
    /// A file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file was read but is not what the command needs.
    #[error("{}: {problem}", path.display())]
    BadFile {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        problem: String,
    },
    /// No `libfastinst.so` to preload.
    #[error("libfastinst.so not found (looked at: {looked}); build it with `cargo build --release -p fastinst-preload`, or pass --lib PATH or set FASTINST_LIB")]
    NoLibrary {
        /// The places tried, comma-separated.
        looked: String,
    },
    /// Attaching to or detaching from a process failed.
    #[error("{0}")]
    Attach(String),
    /// The program could not be started.
    #[error("{}: cannot run it: {source}", program.display())]
    Spawn {
        /// The program.
        program: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

impl CliError {
    /// The exit status for this error: 2 for usage, 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Usage(_) => 2,
            _ => 1,
        }
    }

    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> CliError {
        let path = path.into();
        move |source| CliError::Io { path, source }
    }
}

/// The result of a command.
pub type Result<T> = std::result::Result<T, CliError>;
