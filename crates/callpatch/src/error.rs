//! The one error type of this crate.

/// Why a call-site toggle was refused. Nothing was written when one is returned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A lower-level patching error (page not executable, ...).
    #[error(transparent)]
    Patch(#[from] wordpatch::Error),
    /// The bytes at the site are neither the active form nor an inactive form
    /// this crate writes.
    #[error("bytes at {site:#x} are {found:02x?}: not {form:?} on ({on:02x?}) nor any of its off forms")]
    Unexpected {
        /// The site.
        site: usize,
        /// The site's form.
        form: crate::Form,
        /// The bytes found.
        found: wordpatch::CodeBytes,
        /// The active form expected.
        on: wordpatch::CodeBytes,
    },
    /// The bytes at the site do not start a call-site form this crate toggles.
    #[error("bytes at {site:#x} are {found:02x?}: not call rel32, call [rip+disp32] or jmp rel32")]
    UnknownForm {
        /// The site.
        site: usize,
        /// The bytes found.
        found: wordpatch::CodeBytes,
    },
    /// Paper mode at a 1|4 split needs a `ret` trampoline within ±2 GiB and
    /// none could be placed (the address space near the site is full).
    #[error("no ret trampoline can be placed within ±2 GiB of {site:#x}")]
    NoTrampoline {
        /// The site.
        site: usize,
    },
}
