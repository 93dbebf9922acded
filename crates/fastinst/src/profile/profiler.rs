//! The profiler of the process: its [`State`] and its window [`Schedule`],
//! found by [`get`] from the handlers.
//!
//! A process has one profiler at a time. An attached process that was
//! detached and is attached again gets a new one, a new *generation*
//! ([`install`]). The new one takes over the old one's function table
//! (reset) and each thread's store (renewed at the thread's next hook:
//! `local`), which are most of its memory; the rest of the old one stays,
//! stopped and idle, because nothing proves that no thread still holds a
//! reference to it.

use super::schedule::Schedule;
use super::state::State;
use std::sync::atomic::{AtomicPtr, AtomicU32, Ordering};

/// The profiler: the state every part shares, and the schedule of counting
/// windows, which reads that state and so is kept beside it.
pub(crate) struct Profiler {
    /// What the handlers, the schedule and the report share.
    pub state: State,
    /// The epoch's counting windows in time.
    pub schedule: Schedule,
    /// Its generation: 1 for the process's first profiler.
    pub generation: u32,
}

impl std::ops::Deref for Profiler {
    type Target = State;
    fn deref(&self) -> &State {
        &self.state
    }
}

static PROFILER: AtomicPtr<Profiler> = AtomicPtr::new(std::ptr::null_mut());
static GENERATION: AtomicU32 = AtomicU32::new(0);

/// The current profiler, if one was installed.
#[inline(always)]
pub(crate) fn get() -> Option<&'static Profiler> {
    let p = PROFILER.load(Ordering::Acquire);
    // SAFETY: a non-null pointer was leaked by `install` and is never freed.
    (!p.is_null()).then(|| unsafe { &*p })
}

/// The current profiler's generation (0 before the first).
#[inline(always)]
pub(crate) fn generation() -> u32 {
    GENERATION.load(Ordering::Acquire)
}

/// Whether a profiler is installed and has not stopped: no other may be.
pub(crate) fn running() -> bool {
    get().is_some_and(|p| !p.stop.load(Ordering::Acquire))
}

/// Makes the profiler that `make` builds for the next generation the
/// current one; `false`, and nothing made, while one runs. The caller
/// switches no probe on before this returns.
pub(super) fn install(make: impl FnOnce(u32) -> Profiler) -> bool {
    if running() {
        return false;
    }
    let generation = generation() + 1;
    let p: &'static Profiler = Box::leak(Box::new(make(generation)));
    // The profiler first, then its generation: a thread that sees the new
    // generation and makes itself a store registers it with this one.
    PROFILER.store(p as *const Profiler as *mut Profiler, Ordering::Release);
    GENERATION.store(generation, Ordering::Release);
    true
}
