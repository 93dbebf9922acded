//! The fork handlers: a `fork` child gets code of its own, and no patch
//! half done.
//!
//! Aliased code (`crate::alias`) is shared memory, which a `fork` child
//! would share with its parent: a toggle in one would change the other's
//! code, and the other's tables would not know it. So `prepare` closes the
//! store gate (`crate::gate`), waits for the stores in progress, and copies
//! every aliased region into a fresh `memfd`. The child maps the copies
//! over its code and alias before it runs anything else of this crate;
//! the parent waits for that (at most a second), then opens the gate.
//! Between prepare and that point no store of the parent reaches the code,
//! so the child's copy is the code as it was at the fork. A store in the
//! child that comes before the child handler (another library's child
//! handler patching code) makes the copy itself first.
//!
//! In either write mode, a straddling patch that another thread of the
//! parent had in flight at the fork has no patcher in the child: the child
//! handler finishes or drops it (`crate::inflight::repair_after_fork`).
//!
//! `vfork` and `posix_spawn` run no handlers and need none: their child
//! shares all memory until it calls `exec`. A `fork` copies the aliased
//! code.

use crate::alias::{map_over, new_memfd, CODE_PROT, MAX_REGIONS, REGIONS};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicUsize, Ordering};

/// One fork at a time.
static FORK_LOCK: AtomicBool = AtomicBool::new(false);
/// The copies made by prepare, a `memfd` per region (-1: none).
static COPIES: [AtomicI32; MAX_REGIONS] = [const { AtomicI32::new(-1) }; MAX_REGIONS];
/// A shared page: its first word is set by the child once it has its copy.
static DONE_PAGE: AtomicUsize = AtomicUsize::new(0);
/// `errno` as it was before prepare cleared it (see `parent`).
static SAVED_ERRNO: AtomicI32 = AtomicI32::new(0);
/// Forks whose child did not report its copy within the wait.
static CHILD_LATE: AtomicUsize = AtomicUsize::new(0);

/// The longest the parent waits for the child's copy.
const CHILD_WAIT_NS: u64 = 1_000_000_000;

/// Registers the fork handlers (once) and makes stores pass the gate.
pub(crate) fn install() {
    install_handlers();
    crate::gate::enable();
}

/// Registers the fork handlers, once: the child's repair of patches in
/// flight is needed in either write mode.
#[inline]
pub(crate) fn install_handlers() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        DONE_PAGE.store(new_done_page(), Ordering::Release);
        crate::gate::set_child_hook(take_copies);
        // SAFETY: plain extern "C" functions that never unwind (they call
        // only syscalls, atomics and this crate's stores).
        unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
    });
}

fn new_done_page() -> usize {
    // SAFETY: a fresh shared anonymous page: shared with the children this
    // process forks, which report through it.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            crate::geometry::PAGE_SIZE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        0
    } else {
        p as usize
    }
}

fn done_flag() -> Option<&'static AtomicU32> {
    let p = DONE_PAGE.load(Ordering::Acquire);
    // SAFETY: a page of ours that is never unmapped; its first word is only
    // ever used as this atomic.
    (p != 0).then(|| unsafe { &*(p as *const AtomicU32) })
}

extern "C" fn prepare() {
    if !crate::gate::enabled() {
        return;
    }
    while FORK_LOCK.swap(true, Ordering::Acquire) {
        std::thread::yield_now();
    }
    // SAFETY: errno's location is this thread's.
    SAVED_ERRNO.store(unsafe { *libc::__errno_location() }, Ordering::Relaxed);
    crate::gate::close();
    for (r, copy) in REGIONS.iter().zip(&COPIES) {
        let len = r.len.load(Ordering::Acquire);
        copy.store(if len == 0 { -1 } else { copy_region(r, len) }, Ordering::Relaxed);
    }
    if let Some(d) = done_flag() {
        d.store(0, Ordering::SeqCst);
    }
    // SAFETY: errno's location is this thread's; cleared so that `parent`
    // can tell a failed fork (which sets it) from one that succeeded.
    unsafe { *libc::__errno_location() = 0 };
}

/// A `memfd` holding region `r`'s code as it is now, or -1.
fn copy_region(r: &crate::alias::Region, len: usize) -> i32 {
    let mut name = [0u8; 256];
    let n = crate::alias::name_of(r, &mut name);
    let Ok(cname) = std::ffi::CStr::from_bytes_until_nul(&name[..=n]) else {
        return -1;
    };
    let Ok(fd) = new_memfd(cname, len) else {
        return -1;
    };
    let alias = r.alias.load(Ordering::Relaxed);
    let mut done = 0;
    while done < len {
        // SAFETY: reads our own alias mapping, `len` bytes long, into our
        // own descriptor.
        let w = unsafe {
            libc::pwrite(
                fd,
                (alias + done) as *const libc::c_void,
                len - done,
                done as libc::off_t,
            )
        };
        if w <= 0 {
            // SAFETY: our own descriptor.
            unsafe { libc::close(fd) };
            return -1;
        }
        done += w as usize;
    }
    fd
}

extern "C" fn parent() {
    if !crate::gate::enabled() {
        return;
    }
    // SAFETY: errno's location is this thread's.
    let failed = unsafe { *libc::__errno_location() } != 0;
    if !failed {
        if let Some(d) = done_flag() {
            let start = now_ns();
            while d.load(Ordering::SeqCst) == 0 {
                if now_ns() - start > CHILD_WAIT_NS {
                    CHILD_LATE.fetch_add(1, Ordering::Relaxed);
                    break;
                }
                std::thread::yield_now();
            }
        }
        // SAFETY: as above; the fork succeeded, so errno is put back.
        unsafe { *libc::__errno_location() = SAVED_ERRNO.load(Ordering::Relaxed) };
    }
    for copy in &COPIES {
        let fd = copy.swap(-1, Ordering::Relaxed);
        if fd >= 0 {
            // SAFETY: a descriptor prepare opened; the child has its own.
            unsafe { libc::close(fd) };
        }
    }
    crate::gate::open();
    FORK_LOCK.store(false, Ordering::Release);
}

extern "C" fn child() {
    if crate::gate::enabled() {
        take_copies();
    }
    crate::inflight::repair_after_fork();
}

/// In a fork child: maps the copies prepare made over the code and its
/// alias, reports to the parent, and opens the gate. Runs while the child
/// has one thread. Idempotent.
fn take_copies() {
    for (r, copy) in REGIONS.iter().zip(&COPIES) {
        let fd = copy.swap(-1, Ordering::Relaxed);
        let len = r.len.load(Ordering::Acquire);
        if fd < 0 || len == 0 {
            continue;
        }
        let (start, alias) = (r.start.load(Ordering::Relaxed), r.alias.load(Ordering::Relaxed));
        // SAFETY: replaces this child's alias and code mappings of the
        // region with private-to-the-child mappings of a copy of the same
        // bytes; the child has one thread, which is here.
        unsafe {
            map_over(alias, len, libc::PROT_READ | libc::PROT_WRITE, fd);
            map_over(start, len, CODE_PROT, fd);
            libc::close(fd);
        }
    }
    if let Some(d) = done_flag() {
        d.store(1, Ordering::SeqCst);
    }
    // The child's own forks report through a page of its own.
    DONE_PAGE.store(new_done_page(), Ordering::Release);
    crate::gate::reset_in_child();
    FORK_LOCK.store(false, Ordering::Release);
}

fn now_ns() -> u64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: writes the timespec we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// Forks whose child did not report its copy of the code within a second
/// (the parent went on; its stores from then on may reach such a child's
/// code if that child had not yet made its copy).
pub fn forks_with_late_child() -> usize {
    CHILD_LATE.load(Ordering::Relaxed)
}
