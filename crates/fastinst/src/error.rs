//! The runtime's error type and its C status codes.

use crate::c_abi::{Status, STATUSES};
use crate::probe::ProbeId;

/// Why a runtime operation failed. Each variant has a stable C status code
/// ([`Error::code`]), documented in `fastinst.h`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No probe has this id.
    #[error("no probe with id {0}")]
    NoSuchProbe(ProbeId),
    /// The probe's site was in a library that has been unloaded.
    #[error("probe {0} was in a library that has been unloaded")]
    Unloaded(ProbeId),
    /// No discovered probe belongs to a function at this address.
    #[error("no probe of a function at {0:#x}")]
    NoSuchFunction(usize),
    /// A value is not valid (a null handler, an unknown strategy name).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// Too many discovery callbacks are registered.
    #[error("too many discovery callbacks (at most {0})")]
    TooManyCallbacks(usize),
    /// The code could not be patched.
    #[error("patching probe {id} failed: {source}")]
    Patch {
        /// The probe.
        id: ProbeId,
        /// What the patching layer said.
        source: callpatch::Error,
    },
    /// The code could not be patched by wordpatch.
    #[error("patching probe {id} failed: {source}")]
    WordPatch {
        /// The probe.
        id: ProbeId,
        /// What wordpatch said.
        source: wordpatch::Error,
    },
    /// An internal failure that should not happen (a caught panic).
    #[error("internal error: {0}")]
    Internal(&'static str),
}

impl Error {
    /// The C status code: 0 is success, errors are negative.
    pub fn code(&self) -> i32 {
        self.status().code
    }

    /// Its entry in the C ABI's table of status codes.
    pub fn status(&self) -> &'static Status {
        &STATUSES[match self {
            Error::NoSuchProbe(_) => 1,
            Error::Unloaded(_) => 2,
            Error::NoSuchFunction(_) => 3,
            Error::InvalidArgument(_) => 4,
            Error::TooManyCallbacks(_) => 5,
            Error::Patch { .. } | Error::WordPatch { .. } => 6,
            Error::Internal(_) => 7,
        }]
    }
}

/// Result of a runtime operation.
pub type Result<T> = std::result::Result<T, Error>;
