//! How a new asynchronous patch wakes a parked [`Finisher`](crate::Finisher):
//! a flag load when none is parked.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::thread::Thread;
use std::time::Duration;

static PARKED: AtomicBool = AtomicBool::new(false);
static THREAD: Mutex<Option<Thread>> = Mutex::new(None);

/// Wakes a parked finisher; a flag load when none is parked.
pub(crate) fn wake() {
    if PARKED.load(Ordering::Acquire) {
        if let Ok(g) = THREAD.try_lock() {
            if let Some(t) = g.as_ref() {
                t.unpark();
            }
        }
    }
}

/// Makes the calling thread the one [`wake`] unparks.
pub(crate) fn register() {
    *THREAD.lock().unwrap_or_else(|e| e.into_inner()) = Some(std::thread::current());
}

/// Parks for at most `limit`, if `idle` still holds once the thread is
/// marked parked (so that a patch started in between is not missed).
pub(crate) fn park(limit: Duration, idle: impl Fn() -> bool) {
    PARKED.store(true, Ordering::SeqCst);
    if idle() {
        std::thread::park_timeout(limit);
    }
    PARKED.store(false, Ordering::SeqCst);
}
