//! The thread that registers the sleds of libraries loaded after the
//! start: it looks at the loader's module counter every 10 ms and calls
//! the provider's `load` (handed in as `load`) when it moved.
//!
//! Under `LD_PRELOAD` it starts at the program's first `dlopen` (see the
//! module doc of [`crate::sled`]) and runs for the life of the process. An
//! attached runtime cannot see the program's `dlopen` calls (they were
//! bound before the library came), so it starts the thread with the attach
//! and ends it at the detach ([`stop_watching`]), before any
//! probe goes off: no library is probed after the detach began, and the
//! command puts back the sleds of every library loaded meanwhile.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::thread::JoinHandle;
use std::time::Duration;

/// How often the loader's module counter is looked at.
const PERIOD: Duration = Duration::from_millis(10);

static WATCHING: AtomicBool = AtomicBool::new(false);
static WATCH_ON_DLOPEN: AtomicBool = AtomicBool::new(false);
/// Asks the thread to end; it sees it within a look (it is woken).
static STOP: AtomicBool = AtomicBool::new(false);
/// The running thread, for [`stop_watching`] to wake and join.
static THREAD: Mutex<Option<JoinHandle<()>>> = Mutex::new(None);

/// Starts the thread that calls `load` for libraries loaded later (once
/// until [`stop_watching`]; see the module doc).
pub(crate) fn watch(load: fn()) {
    if WATCHING.swap(true, Ordering::AcqRel) {
        return;
    }
    let h = spawn(load);
    *THREAD.lock().unwrap_or_else(|e| e.into_inner()) = h;
}

/// Starts the watcher ([`watch`]) when the program first calls `dlopen`
/// or `dlmopen` (the preload library interposes both), not before: most
/// programs never load a library, and a thread, even one that only
/// sleeps, puts glibc in its multi-threaded mode for the rest of the run
/// (its `malloc` and `free` then take the arena lock).
pub fn watch_from_first_dlopen() {
    WATCH_ON_DLOPEN.store(true, Ordering::Release);
}

/// A library is about to be loaded (the interposed `dlopen`).
pub(crate) fn library_loading(load: fn()) {
    if WATCH_ON_DLOPEN.load(Ordering::Acquire) && !WATCHING.load(Ordering::Relaxed) {
        let _ = std::panic::catch_unwind(|| watch(load));
    }
}

/// Ends the thread and waits for it (a detach): a `load` it had begun
/// finishes first. Nothing when none runs. [`watch`] may
/// start it again.
pub(crate) fn stop_watching() {
    let h = THREAD.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(h) = h {
        STOP.store(true, Ordering::Release);
        h.thread().unpark();
        let _ = h.join();
        STOP.store(false, Ordering::Release);
    }
    WATCHING.store(false, Ordering::Release);
}

fn spawn(load: fn()) -> Option<JoinHandle<()>> {
    // Read before the thread exists: the interposed `dlopen` starts it
    // just before the loader runs, and a count read by the new thread
    // could already hold that very library, which would then never be
    // looked at.
    let mut seen = crate::modules::load_count();
    let r = std::thread::Builder::new()
        .name("fastinst-sleds".into())
        .spawn(move || loop {
            std::thread::park_timeout(PERIOD);
            if STOP.load(Ordering::Acquire) {
                return;
            }
            let n = crate::modules::load_count();
            if n != seen {
                seen = n;
                let _ = std::panic::catch_unwind(load);
            }
        });
    match r {
        Ok(h) => Some(h),
        Err(e) => {
            crate::log::warn(format_args!(
                "no sled watcher thread ({e}): libraries loaded later get no probes"
            ));
            None
        }
    }
}

/// In a forked child: the watcher thread did not survive the fork. Its
/// handle is the parent's thread's, which the child must never join or
/// detach; the mutex is only tried (a thread of the parent may have held
/// it at the fork).
pub(crate) fn watch_after_fork(load: fn()) {
    if !WATCHING.load(Ordering::Acquire) {
        return;
    }
    let h = spawn(load);
    if let Ok(mut g) = THREAD.try_lock() {
        if let Some(parents) = g.take() {
            std::mem::forget(parents);
        }
        *g = h;
    }
}
