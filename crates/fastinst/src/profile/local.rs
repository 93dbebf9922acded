//! Each thread's [`ThreadStore`], found from the handlers in one load.
//!
//! A `thread_local!` owns the store (its destructor drops the frames a
//! thread that exits leaves open); a static TLS word mirrors a pointer to
//! it ([`crate::arch::tls`]), because the `thread_local!` access in a shared
//! object is a `__tls_get_addr` call, twice per sample. The word is set when
//! the store is first reached and cleared by the destructor before the
//! store can go, so a non-zero word always points at a live store.
//!
//! A store belongs to one profiler generation (`super::profiler`). When
//! a new profiler follows a detached one, each thread's next hook finds its
//! store's generation old and renews it in place: what it held for the old
//! profiler is dropped and the new one registers it. Until then no probe
//! of the new one is on (its install switches them on last), so no hook
//! reads an old store for it.

use super::profiler::{generation, get};
use super::store::{Counters, ThreadStore};
use super::thread::{Agg, Shadow};
use parking_lot::Mutex;
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

/// The thread's store; renewed in place, on the owning thread only, when
/// the profiler's generation moves on.
struct Local(Arc<ThreadStore>);

impl Local {
    /// The store, renewed first if it is of an old generation.
    fn store(&self) -> &ThreadStore {
        if self.0.generation.load(Ordering::Relaxed) != generation() {
            renew(&self.0);
        }
        &self.0
    }
}

impl Drop for Local {
    fn drop(&mut self) {
        crate::arch::tls::set_profile_store(0);
        let s = &self.0;
        // The thread is exiting: its open frames will never exit.
        // SAFETY: the destructor runs on the owning thread, and with the
        // word above cleared no handler reaches the shadow stack after it.
        let sh = unsafe { &mut *s.shadow.get() };
        if let Some(p) = get().filter(|p| p.generation == s.generation.load(Ordering::Relaxed)) {
            // Its calls still in flight end with it (a thread body that
            // called pthread_exit).
            super::frames::close_open_frames(p, s, sh);
        }
        s.exited.store(true, Ordering::Relaxed);
        crate::contention::thread_exiting();
        super::exposure::end_thread(s);
        s.died.store(wordpatch::tsc::now(), Ordering::Release);
    }
}

thread_local! {
    static LOCAL: Local = Local(new_store());
}

fn new_store() -> Arc<ThreadStore> {
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    let s = Arc::new(ThreadStore {
        tid,
        generation: AtomicU32::new(0),
        shadow: UnsafeCell::new(Shadow::new()),
        agg: Mutex::new(Agg::default()),
        exited: AtomicBool::new(false),
        counts: Counters::default(),
        calls: super::counts::Counts::default(),
        died: std::sync::atomic::AtomicU64::new(0),
        x_cpu: std::sync::atomic::AtomicU64::new(0),
        x_wall: std::sync::atomic::AtomicU64::new(0),
        x_hooks: std::sync::atomic::AtomicU64::new(0),
        x_cpu_read: std::sync::atomic::AtomicU64::new(0),
        x_cpu_at: std::sync::atomic::AtomicU64::new(0),
        cpu_final: std::sync::atomic::AtomicU64::new(0),
        clock: std::sync::atomic::AtomicUsize::new(
            crate::clock::current().map_or(0, |c| c as *const crate::clock::ThreadClock as usize),
        ),
        draws: std::sync::atomic::AtomicU64::new(super::choose::seed(wordpatch::tsc::now() ^ (tid as u64) << 32)),
    });
    // The stores stay for the life of the process: the list the sampler and
    // the window schedule read without a lock holds them by reference.
    std::mem::forget(s.clone());
    register(&s);
    s
}

/// Registers store `s` with the current profiler: its exposure starts,
/// its CPU sample event opens, and the profiler's lists take it.
fn register(s: &Arc<ThreadStore>) {
    s.generation.store(get().map_or(0, |p| p.generation), Ordering::Relaxed);
    super::exposure::start_thread(s);
    if let Some(p) = get() {
        let _ = p.exposure_began.compare_exchange(
            0,
            s.x_wall.load(Ordering::Relaxed),
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }
    super::cpusample::thread_start();
    if let Some(p) = get() {
        p.threads.lock().push(s.clone());
        // SAFETY: `new_store` forgot a reference to it: it is never freed.
        let forever: &'static ThreadStore = unsafe { &*Arc::as_ptr(s) };
        p.add_store(forever);
        s.calls.reserve(p.funcs.len());
    }
}

/// Makes this thread's store, of an earlier generation, one of the current
/// one's, in place: what it gathered for the earlier profiler (its
/// aggregates, counters, sampled calls in flight) is dropped, so that a
/// new generation allocates no new store for it.
fn renew(s: &Arc<ThreadStore>) {
    *s.agg.lock() = Agg::default();
    s.counts.reset();
    s.calls.open_all();
    // SAFETY: on the owning thread, in a hook (no handler re-enters) or
    // at its first: nothing else reaches its shadow stack.
    unsafe { *s.shadow.get() = Shadow::new() };
    s.exited.store(false, Ordering::Relaxed);
    s.died.store(0, Ordering::Relaxed);
    s.cpu_final.store(0, Ordering::Relaxed);
    register(s);
}

/// Runs `f` on this thread's store; `None` while the thread is exiting.
#[inline(always)]
pub(super) fn with_local<R>(f: impl FnOnce(&ThreadStore, &mut Shadow) -> R) -> Option<R> {
    let p = crate::arch::tls::profile_store() as *const ThreadStore;
    // SAFETY: a non-zero word points at this thread's live store (the
    // module doc); reading its generation reads that store.
    let current = !p.is_null() && unsafe { (*p).generation.load(Ordering::Relaxed) } == generation();
    if current {
        // SAFETY: a non-zero word points at this thread's store, which its
        // `Local` keeps alive until it clears the word. Only this thread
        // reaches its own shadow stack, and no handler re-enters (the
        // hook's recursion guard).
        return Some(unsafe { f(&*p, &mut *(*p).shadow.get()) });
    }
    first_use(f)
}

#[cold]
fn first_use<R>(f: impl FnOnce(&ThreadStore, &mut Shadow) -> R) -> Option<R> {
    LOCAL
        .try_with(|l| {
            let s = l.store();
            crate::arch::tls::set_profile_store(s as *const ThreadStore as u64);
            // SAFETY: as in `with_local`.
            let sh = unsafe { &mut *s.shadow.get() };
            f(s, sh)
        })
        .ok()
}

/// This thread's store, if it has one and is not exiting.
pub(super) fn current() -> Option<Arc<ThreadStore>> {
    LOCAL.try_with(|l| l.0.clone()).ok()
}
