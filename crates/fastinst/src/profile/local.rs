//! Each thread's [`ThreadStore`], found from the handlers in one load.
//!
//! A `thread_local!` owns the store (its destructor drops the frames a
//! thread that exits leaves open); a static TLS word mirrors a pointer to
//! it ([`crate::arch::tls`]), because the `thread_local!` access in a shared
//! object is a `__tls_get_addr` call, twice per sample. The word is set when
//! the store is first reached and cleared by the destructor before the
//! store can go, so a non-zero word always points at a live store.

use super::profiler::get;
use super::store::{Counters, ThreadStore};
use super::thread::{Agg, Shadow};
use parking_lot::Mutex;
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

struct Local(Arc<ThreadStore>);

impl Drop for Local {
    fn drop(&mut self) {
        crate::arch::tls::set_profile_store(0);
        // The thread is exiting: its open frames will never exit.
        // SAFETY: the destructor runs on the owning thread, and with the
        // word above cleared no handler reaches the shadow stack after it.
        let sh = unsafe { &mut *self.0.shadow.get() };
        if let Some(p) = get() {
            // Its calls still in flight end with it (a thread body that
            // called pthread_exit).
            super::frames::close_open_frames(p, &self.0, sh);
        }
        self.0.exited.store(true, Ordering::Relaxed);
        crate::contention::thread_exiting();
        super::exposure::end_thread(&self.0);
        self.0.died.store(wordpatch::tsc::now(), Ordering::Release);
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
    super::exposure::start_thread(&s);
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
        // The stores stay for the life of the process: the list the
        // sampler and the window schedule read without a lock.
        let leaked: &'static Arc<ThreadStore> = Box::leak(Box::new(s.clone()));
        p.add_store(leaked.as_ref());
        s.calls.reserve(p.funcs.len());
    }
    s
}

/// Runs `f` on this thread's store; `None` while the thread is exiting.
#[inline(always)]
pub(super) fn with_local<R>(f: impl FnOnce(&ThreadStore, &mut Shadow) -> R) -> Option<R> {
    let p = crate::arch::tls::profile_store() as *const ThreadStore;
    if !p.is_null() {
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
            crate::arch::tls::set_profile_store(Arc::as_ptr(&l.0) as u64);
            // SAFETY: as in `with_local`.
            let sh = unsafe { &mut *l.0.shadow.get() };
            f(&l.0, sh)
        })
        .ok()
}

/// This thread's store, if it has one and is not exiting.
pub(super) fn current() -> Option<Arc<ThreadStore>> {
    LOCAL.try_with(|l| l.0.clone()).ok()
}
