//! Messages to stderr, filtered by `FASTINST_LOG` (error, warn, info,
//! debug; default warn). Written with one `write(2)` per line, so lines of
//! concurrent threads do not interleave. Never used on the hook fast path.

use std::fmt::Arguments;
use std::io::Write;
use std::sync::atomic::{AtomicU8, Ordering};

/// Severity, lowest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum Level {
    /// Errors only.
    Error = 0,
    /// Errors and warnings (the default).
    Warn = 1,
    /// Also what the runtime did (modules, probes found, reports written).
    Info = 2,
    /// Everything.
    Debug = 3,
}

static LEVEL: AtomicU8 = AtomicU8::new(Level::Warn as u8);

/// Sets the level.
pub fn set_level(l: Level) {
    LEVEL.store(l as u8, Ordering::Relaxed);
}

/// Parses a level name.
pub fn parse_level(s: &str) -> Option<Level> {
    match s.trim().to_ascii_lowercase().as_str() {
        "error" => Some(Level::Error),
        "warn" | "warning" => Some(Level::Warn),
        "info" => Some(Level::Info),
        "debug" => Some(Level::Debug),
        _ => None,
    }
}

fn emit(l: Level, args: Arguments<'_>) {
    if l as u8 > LEVEL.load(Ordering::Relaxed) {
        return;
    }
    let tag = match l {
        Level::Error => "error",
        Level::Warn => "warning",
        Level::Info => "info",
        Level::Debug => "debug",
    };
    let line = format!("fastinst[{}]: {tag}: {args}\n", std::process::id());
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// Logs an error.
pub fn error(args: Arguments<'_>) {
    emit(Level::Error, args)
}
/// Logs a warning.
pub fn warn(args: Arguments<'_>) {
    emit(Level::Warn, args)
}
/// Logs progress.
pub fn info(args: Arguments<'_>) {
    emit(Level::Info, args)
}
/// Logs details.
pub fn debug(args: Arguments<'_>) {
    emit(Level::Debug, args)
}
