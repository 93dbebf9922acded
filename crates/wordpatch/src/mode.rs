//! How this crate writes code: in place, or through an alias (W^X).

use std::sync::atomic::{AtomicU8, Ordering};

/// How this crate writes code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteMode {
    /// Code pages are made read+write+execute and written in place (the
    /// default): no syscall after a page's first patch, no extra memory.
    InPlace,
    /// W^X: code pages stay read+execute and are written through a writable
    /// alias of the same memory (module doc).
    Alias,
}

static MODE: AtomicU8 = AtomicU8::new(0);

/// Records the mode ([`crate::set_write_mode`] is the public way, which
/// also installs what alias mode needs).
pub(crate) fn set(mode: WriteMode) {
    MODE.store(mode as u8, Ordering::Release);
}

/// The mode [`set_write_mode`](crate::set_write_mode) chose.
pub fn write_mode() -> WriteMode {
    if MODE.load(Ordering::Acquire) == WriteMode::Alias as u8 {
        WriteMode::Alias
    } else {
        WriteMode::InPlace
    }
}
