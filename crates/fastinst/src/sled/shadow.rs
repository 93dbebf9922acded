//! Exit probes by return-address substitution, with a per-thread shadow
//! stack (as ftrace's function-graph tracer and uftrace do).
//!
//! When a function's exit probe is on, its entry trampoline saves the
//! function's return address on this thread's shadow stack, with the
//! function's CFA, and replaces it by the exit trampoline's address. When
//! the function returns there, the runtime finds the entry for that CFA,
//! runs the exit probe and continues at the saved address.
//!
//! What keeps the stack right:
//! - **The match is exact.** An exit takes the topmost entry whose CFA is
//!   the returning frame's; everything above it was pushed later on this
//!   thread and has not returned, so it can never return (`longjmp`, an
//!   exception, a signal handler left by `siglongjmp`): it is dropped and
//!   counted.
//! - **Dead entries go at the next entry too.** A new frame's CFA is below
//!   every live frame's, so an entry with a lower CFA (or the same CFA, when
//!   the new frame was not tail-called from the old one) is dead. The one
//!   exception is a signal handler running on an alternate stack, where
//!   addresses say nothing about the interrupted stack: there only entries
//!   on the alternate stack are dropped (one `sigaltstack` query, made only
//!   when something looks dead).
//! - **Tail calls chain.** A function that was jumped to from a substituted
//!   frame finds the exit trampoline as its return address; it is saved like
//!   any other, so the callee's exit runs first and returns into the exit
//!   trampoline again, which then runs the caller's exit, both when the
//!   callee returns (which is when the caller returns too). Its handlers
//!   are told it was called from the function that jumped to it. A tail call
//!   from a frame that was not substituted cannot be seen: the callee looks
//!   called by the caller's caller, whose frame it will return to.
//! - **Unwinding never sees a substituted address.** Before an exception
//!   or `pthread_exit` unwinds ([`super::unwind`]), every substituted slot of
//!   the thread gets its original address back and its entry is marked
//!   restored: those frames' exits are lost (and counted), never wrong.
//! - **Signal safety.** A signal handler may run instrumented code at any
//!   point of these functions, on the same thread. A push writes a sentinel
//!   entry (CFA `u64::MAX`, never dead, never matched) before it raises the
//!   top, and fills it after; a pop reads its entry before it lowers the
//!   top. A handler's pushes and pops stay above the interrupted one's.
//! - **Bounded.** [`CAPACITY`] entries per thread: a call that would
//!   overflow is not substituted (its exit is lost and counted). Threads free
//!   their stack when they exit.
//!
//! Not supported: user-level stack switching (`swapcontext`, green
//! threads) while exit probes are on. A return that finds no entry cannot be
//! continued; the process is stopped with a message saying so.

use crate::code::ON;
use crate::hooks;
use crate::probe::ProbeId;
use crate::registry;
use std::sync::atomic::{compiler_fence, AtomicU64, AtomicUsize, Ordering};

/// Where substituted return addresses point: the exit trampoline of the
/// machine's vector width, chosen once by `trampoline` before any stub is
/// made.
static RETURN: AtomicUsize = AtomicUsize::new(0);

/// The address substituted return addresses point at. Constant once any
/// stub exists.
#[inline(always)]
pub(crate) fn return_addr() -> u64 {
    RETURN.load(Ordering::Relaxed) as u64
}

/// Sets [`return_addr`] (the trampolines, once, before any stub exists).
pub(crate) fn set_return_addr(addr: usize) {
    RETURN.store(addr, Ordering::Relaxed);
}

/// Shadow entries per thread.
pub const CAPACITY: usize = 8191;

/// Calls whose exit could not be watched: the thread's shadow stack was
/// full or could not be allocated.
pub(crate) static FULL: AtomicU64 = AtomicU64::new(0);
/// Entries dropped because their frames can no longer return normally.
pub(crate) static ABANDONED: AtomicU64 = AtomicU64::new(0);
/// Substituted return addresses put back before unwinding.
pub(crate) static RESTORED: AtomicU64 = AtomicU64::new(0);
/// Exits delivered through the exit trampoline.
pub(crate) static EXITS: AtomicU64 = AtomicU64::new(0);

#[repr(C)]
#[derive(Clone, Copy)]
struct Entry {
    cfa: u64,
    orig: u64,
    exit: ProbeId,
    restored: u32,
}

#[repr(C)]
struct Stack {
    top: usize,
    cap: usize,
    entries: [Entry; CAPACITY],
}

const BYTES: usize = std::mem::size_of::<Stack>();

// This thread's shadow stack: a static TLS word ([`crate::arch::tls`]), read on
// every sled invocation.
#[inline(always)]
fn tls_get() -> *mut Stack {
    crate::arch::tls::sled_shadow() as *mut Stack
}

#[inline(always)]
fn tls_set(p: *mut Stack) {
    crate::arch::tls::set_sled_shadow(p as u64)
}

static KEY: std::sync::OnceLock<Option<libc::pthread_key_t>> = std::sync::OnceLock::new();

/// Creates the thread-exit key now (not on a hot path or in a signal
/// handler).
pub(crate) fn init() {
    KEY.get_or_init(|| {
        let mut k: libc::pthread_key_t = 0;
        // SAFETY: `free_stack` matches the destructor type.
        (unsafe { libc::pthread_key_create(&mut k, Some(free_stack)) } == 0).then_some(k)
    });
}

unsafe extern "C" fn free_stack(p: *mut libc::c_void) {
    if tls_get() as *mut libc::c_void == p {
        tls_set(std::ptr::null_mut());
    }
    // SAFETY: `p` is a mapping of BYTES that `alloc` made for this thread,
    // which is exiting: no frame of it returns through its entries any more.
    unsafe { libc::munmap(p, BYTES) };
}

/// This thread's stack, mapped on first use (mmap and pthread_setspecific
/// with an early key are async-signal-safe in practice: no allocation).
fn stack_or_alloc() -> *mut Stack {
    let s = tls_get();
    if !s.is_null() {
        return s;
    }
    // Zero-filled, so top = 0.
    let Ok(p) = crate::mapping::map(BYTES, libc::PROT_READ | libc::PROT_WRITE) else {
        return std::ptr::null_mut();
    };
    let p = p as *mut libc::c_void;
    let s = p as *mut Stack;
    // SAFETY: the fresh mapping is ours.
    unsafe { (*s).cap = CAPACITY };
    tls_set(s);
    if let Some(Some(k)) = KEY.get() {
        // SAFETY: a key this module created.
        unsafe { libc::pthread_setspecific(*k, p) };
    }
    s
}

// Every access goes through these volatile helpers: a signal handler on
// this thread may change the stack between any two of them.
#[inline(always)]
fn top(s: *mut Stack) -> usize {
    // SAFETY: `s` is this thread's live stack.
    unsafe { std::ptr::addr_of!((*s).top).read_volatile() }
}

#[inline(always)]
fn set_top(s: *mut Stack, v: usize) {
    compiler_fence(Ordering::SeqCst);
    // SAFETY: as above.
    unsafe { std::ptr::addr_of_mut!((*s).top).write_volatile(v) };
    compiler_fence(Ordering::SeqCst);
}

#[inline(always)]
fn entry(s: *mut Stack, i: usize) -> Entry {
    // SAFETY: `i < CAPACITY` (callers index below the top).
    unsafe { std::ptr::addr_of!((*s).entries[i]).read_volatile() }
}

#[inline(always)]
fn set_entry(s: *mut Stack, i: usize, e: Entry) {
    // SAFETY: as above.
    unsafe { std::ptr::addr_of_mut!((*s).entries[i]).write_volatile(e) };
}

/// The caller of a frame at `cfa` entered by a tail call from a
/// substituted frame (its return address is the exit trampoline): a
/// return address inside the function that made the tail call (its sled's
/// end), found from the topmost entry below index `below` with that CFA.
/// The entry and the exit of the tail-called frame name the same caller.
fn chained_caller(s: *mut Stack, cfa: u64, below: usize) -> u64 {
    (0..below)
        .rev()
        .map(|i| entry(s, i))
        .find(|e| e.cfa == cfa && e.restored == 0)
        .and_then(|e| registry::get(e.exit))
        .map_or(0, |p| (p.meta.site + providers::patchable::SLED_LEN) as u64)
}

fn prune(s: *mut Stack, cfa: u64, chained: bool) {
    let mut checked = false;
    loop {
        let t = top(s);
        if t == 0 {
            return;
        }
        let e = entry(s, t - 1);
        let dead = e.cfa < cfa || (e.cfa == cfa && !chained);
        if !dead {
            return;
        }
        if !checked {
            if !crate::altstack::may_drop(e.cfa) {
                return;
            }
            checked = true;
        }
        if e.restored == 0 {
            ABANDONED.fetch_add(1, Ordering::Relaxed);
        }
        set_top(s, t - 1);
    }
}

/// Called by the entry trampoline with the entry probe `id` and the address
/// of the function's return-address slot.
pub(crate) extern "C" fn sled_enter(raw_id: u32, slot: *mut u64, started: u64) -> usize {
    // One test for a sled at a function entry, the common site; the
    // others are marked in the id (`FRAME_POINTER_SITE`, `POINT_SITE`).
    if raw_id & (FRAME_POINTER_SITE | POINT_SITE) != 0 {
        return other_site_enter(raw_id, slot, started);
    }
    enter_at(ProbeId::new(raw_id), slot, started)
}

/// [`sled_enter`] for a site not at a function entry: a `-pg` `mcount`
/// site, whose return address is found through the frame pointer, or a
/// point, which has a handler and no function, caller or exit.
#[cold]
fn other_site_enter(raw_id: u32, slot: *mut u64, started: u64) -> usize {
    if raw_id & POINT_SITE != 0 {
        if crate::arch::tls::guard_get() {
            crate::stats::bump(&crate::stats::DROPPED_NESTED);
            return 0;
        }
        let (clock, started) = crate::clock::begin_hook(started);
        hooks::fire_unclocked(ProbeId::new(raw_id & !POINT_SITE), 0, slot as u64, 0, started);
        return clock;
    }
    // The trampoline's saved `rbp` is the first word of its frame, three
    // words below `slot` (the stub's id and the sled's return address lie
    // between); at an mcount site it is the function's frame pointer, set
    // by its `push rbp; mov rbp, rsp` (checked at registration).
    // SAFETY: that word is in the trampoline's live frame.
    let rbp = unsafe { slot.sub(3).read() };
    enter_at(
        ProbeId::new(raw_id & !FRAME_POINTER_SITE),
        (rbp + 8) as *mut u64,
        started,
    )
}

/// [`sled_enter`] once the function's return-address slot is known.
#[inline(always)]
fn enter_at(id: ProbeId, slot: *mut u64, started: u64) -> usize {
    if crate::arch::tls::guard_get() {
        // A handler's own calls are not probed (the recursion guard).
        crate::stats::bump(&crate::stats::DROPPED_NESTED);
        return 0;
    }
    // SAFETY: the trampoline passes the slot just above its own frame, which
    // holds the function's return address.
    let ret = unsafe { slot.read() };
    let cfa = slot as u64 + 8;
    let tramp = return_addr();
    let chained = ret == tramp;
    let caller = if chained {
        let s = tls_get();
        if s.is_null() {
            0
        } else {
            chained_caller(s, cfa, top(s))
        }
    } else {
        ret
    };
    let (clock, started) = crate::clock::begin_hook(started);
    crate::arch::tls::set_exit_declined(0);
    hooks::fire_unclocked(id, caller, slot as u64, cfa, started);
    watch_exit(id, slot, cfa, ret, chained);
    clock
}

/// The entry probe id of the sled the clock's calibration runs
/// (`crate::clock::calibrate`): no probe has it (so its handlers find
/// nothing to run), and its exit is watched as if its exit probe were on,
/// so the calibration pays every step a watched sled call pays.
pub(crate) const CALIBRATION_ID: ProbeId = ProbeId::new(POINT_SITE - 3);

/// The bit of a stub's id that marks a `-pg` `mcount` site
/// ([`providers::mcount::Frame::FramePointer`]): the function's prologue
/// has run, and its return address is found through its frame pointer.
/// Above every probe id.
pub(crate) const FRAME_POINTER_SITE: u32 = 1 << 30;
/// The bit of a stub's id that marks a point probe (`fastinst::probe!`):
/// not at a function entry, so no return address to watch.
pub(crate) const POINT_SITE: u32 = 1 << 29;
const _: () = assert!(crate::registry::MAX_PROBES < POINT_SITE as usize);
const _: () = assert!(CALIBRATION_ID.get() & (POINT_SITE | FRAME_POINTER_SITE) == 0);

/// Substitutes the return address of the call entered through `id` when
/// its exit probe is on and its entry handler did not decline ([`decline_exit`]).
#[inline(always)]
fn watch_exit(id: ProbeId, slot: *mut u64, cfa: u64, ret: u64, chained: bool) {
    if crate::arch::tls::take_exit_declined() {
        return;
    }
    let tramp = return_addr();
    // The clock's calibration probe has no record; its exit is watched.
    if id != CALIBRATION_ID {
        let Some(x) = registry::get(id.next()) else { return };
        if x.state.load(Ordering::Relaxed) & ON == 0 {
            return;
        }
    }
    let s = stack_or_alloc();
    if s.is_null() {
        FULL.fetch_add(1, Ordering::Relaxed);
        return;
    }
    prune(s, cfa, chained);
    let t = top(s);
    if t >= CAPACITY {
        FULL.fetch_add(1, Ordering::Relaxed);
        return;
    }
    set_entry(
        s,
        t,
        Entry {
            cfa: u64::MAX,
            orig: 0,
            exit: ProbeId::new(0),
            restored: 1,
        },
    );
    set_top(s, t + 1);
    set_entry(
        s,
        t,
        Entry {
            cfa,
            orig: ret,
            exit: id.next(),
            restored: 0,
        },
    );
    compiler_fence(Ordering::SeqCst);
    // SAFETY: as above; from here the function returns to the exit
    // trampoline, which finds the entry just written.
    unsafe { slot.write(tramp) };
}

fn fatal(msg: &[u8]) -> ! {
    // SAFETY: write(2) of a static buffer, then abort: async-signal-safe.
    unsafe {
        libc::write(2, msg.as_ptr() as *const libc::c_void, msg.len());
        libc::abort()
    }
}

/// Called by the exit trampoline with the returning function's CFA; writes
/// the address to continue at just below the CFA, and returns the thread
/// clock the trampoline charges with the hook's time (0: none).
pub(crate) extern "C" fn sled_return(cfa: u64, started: u64) -> usize {
    let (clock, started) = crate::clock::begin_hook(started);
    sled_return_inner(cfa, started);
    clock
}

fn sled_return_inner(cfa: u64, started: u64) -> u64 {
    let s = tls_get();
    if s.is_null() {
        fatal(b"fastinst: a function returned to the exit trampoline on a thread without a shadow stack; aborting\n");
    }
    let t = top(s);
    let Some(i) = (0..t).rev().find(|&i| {
        let e = entry(s, i);
        e.restored == 0 && e.cfa == cfa
    }) else {
        fatal(
            b"fastinst: a function returned to the exit trampoline with no shadow-stack entry \
(user-level stack switching such as swapcontext is not supported while exit probes are on); aborting\n",
        )
    };
    let e = entry(s, i);
    let caller = if e.orig == return_addr() {
        chained_caller(s, cfa, i)
    } else {
        e.orig
    };
    let dropped = (i + 1..t).filter(|&j| entry(s, j).restored == 0).count();
    if dropped > 0 {
        ABANDONED.fetch_add(dropped as u64, Ordering::Relaxed);
    }
    set_top(s, i);
    let slot = (cfa - 8) as *mut u64;
    // SAFETY: the exit trampoline reserved this slot (its first push) for
    // the address it returns through.
    unsafe { slot.write(e.orig) };
    EXITS.fetch_add(1, Ordering::Relaxed);
    if !crate::arch::tls::guard_get() {
        hooks::fire_unclocked(e.exit, caller, slot as u64, cfa, started);
    }
    e.orig
}

/// Puts every substituted return address of this thread back, so that an
/// unwinder walking the stack sees only real ones. The entries stay, marked
/// restored; their exits are lost.
pub(crate) fn restore_all() {
    let s = tls_get();
    if s.is_null() {
        return;
    }
    let tramp = return_addr();
    let here = &tramp as *const u64 as u64;
    for i in (0..top(s)).rev() {
        let mut e = entry(s, i);
        if e.restored != 0 {
            continue;
        }
        // A frame below this one's stack pointer is gone (and its memory may
        // hold anything): only live frames are touched.
        if e.cfa > here {
            let slot = (e.cfa - 8) as *mut u64;
            // SAFETY: a live frame's return-address slot on this thread's
            // stack, which the entry trampoline substituted.
            unsafe {
                if slot.read_volatile() == tramp {
                    slot.write_volatile(e.orig);
                    RESTORED.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        e.restored = 1;
        set_entry(s, i, e);
    }
}
