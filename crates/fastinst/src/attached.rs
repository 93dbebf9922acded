//! Whether the runtime runs attached to a process (`crate::attach`), and
//! the report files written meanwhile: what the tools read, kept apart
//! from the attach itself, which starts and stops the tools.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

static ATTACHED: AtomicBool = AtomicBool::new(false);
static WRITTEN: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Whether the runtime runs attached (reports then go to files only).
pub(crate) fn get() -> bool {
    ATTACHED.load(Ordering::Acquire)
}

/// Marks the runtime attached, or detached.
pub(crate) fn set(on: bool) {
    ATTACHED.store(on, Ordering::Release);
}

/// Notes the files a report was written to, for the control's answer.
pub(crate) fn record_written(files: &[PathBuf]) {
    if let Ok(mut w) = WRITTEN.lock() {
        w.extend_from_slice(files);
    }
}

/// The files noted since the last call.
pub(crate) fn take_written() -> Vec<PathBuf> {
    WRITTEN.lock().map(|mut w| std::mem::take(&mut *w)).unwrap_or_default()
}
