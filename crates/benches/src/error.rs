//! Why an evaluation could not be run.

use std::path::PathBuf;

/// A failed evaluation step.
#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    /// A file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A tool (cargo, a compiler) failed or is missing.
    #[error("{0}")]
    Tool(String),
    /// A configuration changed the program's output or exit status.
    #[error("{0}")]
    WrongResult(String),
    /// The command line.
    #[error("{0}")]
    Usage(String),
}

impl EvalError {
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> EvalError {
        let path = path.into();
        move |source| EvalError::Io { path, source }
    }
}

/// The result of an evaluation step.
pub type Result<T> = std::result::Result<T, EvalError>;

impl From<fastinst_args::ArgError> for EvalError {
    fn from(e: fastinst_args::ArgError) -> EvalError {
        EvalError::Usage(e.0)
    }
}
