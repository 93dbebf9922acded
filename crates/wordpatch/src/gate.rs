//! The store gate: every store of this crate to aliased code passes it,
//! and a `fork` closes it while it copies the code (`crate::fork`).
//!
//! A store flags a slot of its thread's own with plain stores; the closer
//! sets `CLOSED`, then runs `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)`,
//! a full barrier on every thread of the process, then waits for every
//! flag to clear. That is an asymmetric fence: a store that flagged its
//! slot before the barrier is seen flagged, and one that had not yet read
//! `CLOSED` reads it set, so the store path needs no locked instruction.
//! Without that `membarrier` command, or for a thread whose slots are all
//! taken, a store counts itself in one counter with a locked add and
//! subtract instead.
//!
//! Only once [`crate::WriteMode::Alias`] was chosen ([`enable`]); before,
//! a store pays one load and a branch.

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};

/// Whether a fork is copying the code: stores wait.
static CLOSED: AtomicBool = AtomicBool::new(false);
/// Stores in progress of threads without a slot (or of every thread where
/// the kernel lacks `membarrier`'s private expedited command).
static GATE: AtomicUsize = AtomicUsize::new(0);
/// Whether stores pass the gate at all (alias mode was chosen).
static ENABLED: AtomicBool = AtomicBool::new(false);
/// Whether `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)` is registered,
/// so that threads may flag their stores in slots (module doc).
static EXPEDITED: AtomicBool = AtomicBool::new(false);
/// The process and thread that closed the gate.
static CLOSER_PID: AtomicI32 = AtomicI32::new(0);
static CLOSER_TID: AtomicI32 = AtomicI32::new(0);
/// What a fork child runs when a store finds the gate closed before the
/// child's fork handler ran (`crate::fork` sets it): its copy of the code.
static CHILD_HOOK: std::sync::OnceLock<fn()> = std::sync::OnceLock::new();

const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_int = 1 << 3;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_int = 1 << 4;

/// A thread's flag "storing now", on a line of its own; `owner` is the
/// thread's thread pointer (0: free).
#[repr(align(64))]
pub(crate) struct Slot {
    owner: AtomicUsize,
    busy: AtomicBool,
}

const SLOTS: usize = 1024;
/// How many slots a thread looks at from its home slot.
const PROBES: usize = 8;
static SLOT: [Slot; SLOTS] = [const {
    Slot {
        owner: AtomicUsize::new(0),
        busy: AtomicBool::new(false),
    }
}; SLOTS];

/// The thread pointer (`fs:0`, the thread control block's address, which
/// glibc and the runtime's own raw threads keep there): a key no two live
/// threads share. Thread-locals are no use here: the runtime's raw threads
/// cannot reach a loaded library's, and a signal handler must not
/// allocate one.
#[inline]
fn thread_pointer() -> usize {
    let tp: usize;
    // SAFETY: reads the first word of the thread control block, which
    // every thread of an x86-64 Linux process has.
    unsafe { core::arch::asm!("mov {}, fs:0", out(reg) tp, options(nostack, readonly, preserves_flags)) };
    tp
}

/// Makes stores pass the gate from now on.
pub(crate) fn enable() {
    register();
    ENABLED.store(true, Ordering::SeqCst);
}

/// Registers for the expedited membarrier that closing the gate uses, once
/// (a later call waits until the first is done).
pub(crate) fn register() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let expedited = crate::wait::membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0;
        EXPEDITED.store(expedited, Ordering::SeqCst);
    });
}

/// Whether stores pass the gate.
pub(crate) fn enabled() -> bool {
    ENABLED.load(Ordering::SeqCst)
}

/// Sets what a fork child runs when one of its stores finds the gate
/// closed (see `CHILD_HOOK`).
pub(crate) fn set_child_hook(f: fn()) {
    let _ = CHILD_HOOK.set(f);
}

/// Closes the gate and waits until no store is in progress. Called by the
/// forking thread, whose own stores (a signal handler's) still pass.
pub(crate) fn close() {
    // SAFETY: getpid and gettid cannot fail.
    unsafe {
        CLOSER_PID.store(libc::getpid(), Ordering::SeqCst);
        CLOSER_TID.store(libc::gettid(), Ordering::SeqCst);
    }
    CLOSED.store(true, Ordering::SeqCst);
    if EXPEDITED.load(Ordering::Relaxed) {
        crate::wait::membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED);
    }
    while GATE.load(Ordering::SeqCst) != 0 || SLOT.iter().any(|s| s.busy.load(Ordering::Acquire)) {
        std::hint::spin_loop();
    }
}

/// Opens the gate again (in the parent, after a fork).
pub(crate) fn open() {
    CLOSED.store(false, Ordering::SeqCst);
}

/// In a fork child, which is one thread: no store is in progress (a flag
/// left set by a parent's thread at the fork is stale); opens the gate.
pub(crate) fn reset_in_child() {
    // SAFETY: getpid cannot fail.
    CLOSER_PID.store(unsafe { libc::getpid() }, Ordering::SeqCst);
    for s in &SLOT {
        s.busy.store(false, Ordering::Relaxed);
    }
    GATE.store(0, Ordering::SeqCst);
    CLOSED.store(false, Ordering::SeqCst);
}

/// A store's passage through the gate; leaving it lets a fork go on.
pub(crate) enum Pass {
    /// No gate (alias mode never chosen, or the forking thread itself).
    Free,
    /// Flagged in this slot.
    Slot(&'static Slot),
    /// Counted in `GATE`.
    Counted,
}

impl Drop for Pass {
    #[inline]
    fn drop(&mut self) {
        match self {
            Pass::Free => {}
            Pass::Slot(s) => s.busy.store(false, Ordering::Release),
            Pass::Counted => {
                GATE.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }
}

/// Waits while a fork copies the code. Async-signal-safe: atomics and
/// syscalls only.
#[inline]
pub(crate) fn pass() -> Pass {
    if !ENABLED.load(Ordering::Relaxed) {
        return Pass::Free;
    }
    loop {
        if let Some(slot) = my_slot() {
            slot.busy.store(true, Ordering::Relaxed);
            // Only the compiler is fenced: prepare's membarrier is the
            // processor's fence for both sides.
            std::sync::atomic::compiler_fence(Ordering::SeqCst);
            if !CLOSED.load(Ordering::Relaxed) {
                return Pass::Slot(slot);
            }
            slot.busy.store(false, Ordering::Release);
        } else {
            GATE.fetch_add(1, Ordering::SeqCst);
            if !CLOSED.load(Ordering::SeqCst) {
                return Pass::Counted;
            }
            GATE.fetch_sub(1, Ordering::SeqCst);
        }
        if let Some(p) = closed_for() {
            return p;
        }
    }
}

/// This thread's slot, claimed at its first store; `None` without
/// expedited membarrier or with its probe window full. A slot stays with
/// its thread pointer: a thread that reuses an ended one's control block
/// (glibc caches them) reuses its slot, and others fall back to the
/// counter.
#[inline]
fn my_slot() -> Option<&'static Slot> {
    if !EXPEDITED.load(Ordering::Relaxed) {
        return None;
    }
    let tp = thread_pointer();
    let home = tp.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (usize::BITS - SLOTS.trailing_zeros());
    for k in 0..PROBES {
        let s = &SLOT[(home + k) % SLOTS];
        match s.owner.load(Ordering::Relaxed) {
            o if o == tp => return Some(s),
            0 if s
                .owner
                .compare_exchange(0, tp, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok() =>
            {
                return Some(s)
            }
            _ => {}
        }
    }
    None
}

/// The gate is closed: says whether this store may go on anyway.
#[cold]
fn closed_for() -> Option<Pass> {
    // SAFETY: getpid and gettid take no arguments and cannot fail.
    let (pid, tid) = unsafe { (libc::getpid(), libc::gettid()) };
    if pid != CLOSER_PID.load(Ordering::SeqCst) {
        // A fork child whose fork handler has not run yet.
        match CHILD_HOOK.get() {
            Some(f) => f(),
            None => reset_in_child(),
        }
        return None;
    }
    if tid == CLOSER_TID.load(Ordering::SeqCst) {
        // The forking thread itself, in a signal handler during prepare:
        // the copies are being made or made; its store is its own.
        return Some(Pass::Free);
    }
    std::thread::yield_now();
    None
}
