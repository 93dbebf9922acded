//! `libfastinst.so`, the library that `LD_PRELOAD` loads into a program:
//! nothing but what a preloaded shared object needs around the runtime
//! (the `fastinst` crate, which does the work):
//!
//! - its constructor (`.init_array`), which starts the runtime from the
//!   `FASTINST_*` variables ([`fastinst::process::start_from_env`]) and
//!   registers the exit and fork handlers;
//! - its allocator ([`heap`]): while the program runs, the runtime's
//!   allocations never come from the program's `malloc`;
//! - the libc entry points it interposes: `dlopen` and `dlmopen` (the sled
//!   watcher starts when a program first loads a library) and `dlclose`
//!   (probes of an unloaded library are never touched again);
//! - the C API of `include/fastinst.h` ([`capi`]).
//!
//! The `-finstrument-functions` hooks and the unwinder's entry points are
//! the runtime's own: a program that links `fastinst` statically gets them
//! without this library.
//!
//! The library is a `cdylib` only: nothing links it as a Rust crate, so its
//! allocator and exported symbols never reach another binary (the
//! `fastinst` command in particular).

pub mod capi;
pub mod heap;

use std::ffi::{c_int, c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

/// While the program runs, every allocation of the runtime's Rust code
/// comes from its own mappings, not from the program's `malloc` heap (see
/// [`heap`]).
#[global_allocator]
static HEAP: heap::Heap = heap::Heap;

extern "C" fn ctor() {
    let _ = std::panic::catch_unwind(|| {
        if fastinst::attach::pending() {
            // `fastinst attach` loaded it into a running process and
            // starts it next, from its settings (`capi::fastinst_attach_start`).
            return;
        }
        fastinst::process::start_from_env();
        fastinst::control::serve_from_env();
        // SAFETY: plain extern "C" functions that catch every panic; they
        // take and release only locks the runtime owns.
        unsafe { libc::pthread_atfork(Some(fork_prepare), Some(fork_parent), Some(fork_child)) };
        // SAFETY: a plain extern "C" function that catches every panic.
        unsafe { libc::atexit(at_exit) };
    });
}

#[used]
#[link_section = ".init_array"]
static CTOR: extern "C" fn() = ctor;

extern "C" fn at_exit() {
    // The program is done with its heap: the reports' many blocks come
    // from the system allocator, which reuses memory better (see `heap`).
    heap::hand_over();
    let _ = std::panic::catch_unwind(fastinst::process::finish);
    let _ = std::panic::catch_unwind(fastinst::control::end);
}

/// Registers the exit handler of an attached runtime: a process that ends
/// while attached gets its reports, as under `LD_PRELOAD`.
pub(crate) fn at_exit_while_attached() {
    extern "C" fn at_exit_attached() {
        if fastinst::attach::attached() {
            let _ = std::panic::catch_unwind(fastinst::process::finish);
        }
    }
    // SAFETY: a plain extern "C" function that catches every panic.
    unsafe { libc::atexit(at_exit_attached) };
}

extern "C" fn fork_prepare() {
    let _ = std::panic::catch_unwind(fastinst::process::fork_prepare);
}

extern "C" fn fork_parent() {
    let _ = std::panic::catch_unwind(fastinst::process::fork_parent);
}

extern "C" fn fork_child() {
    let _ = std::panic::catch_unwind(fastinst::process::fork_child);
}

/// Where `dlopen` and `dlmopen` go: glibc's, found once with `RTLD_NEXT`;
/// 0 if the lookup failed.
fn real_symbol(slot: &AtomicUsize, name: &CStr) -> usize {
    let p = slot.load(Ordering::Acquire);
    if p != 0 {
        return p;
    }
    // SAFETY: RTLD_NEXT lookup of a libc symbol by a NUL-terminated name.
    let p = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) } as usize;
    slot.store(p, Ordering::Release);
    p
}

/// Called by the `dlopen` stub before glibc's: a program with sleds gets
/// its sled watcher now, when it first loads a library. Returns glibc's
/// `dlopen` (0: none).
extern "C" fn before_dlopen() -> usize {
    static REAL: AtomicUsize = AtomicUsize::new(0);
    fastinst::process::library_loading();
    real_symbol(&REAL, c"dlopen")
}

/// As [`before_dlopen`], for `dlmopen`.
extern "C" fn before_dlmopen() -> usize {
    static REAL: AtomicUsize = AtomicUsize::new(0);
    fastinst::process::library_loading();
    real_symbol(&REAL, c"dlmopen")
}

/// The body of the `dlopen`/`dlmopen` stubs: saves the argument registers
/// (three pushes also align the stack for the call), calls `$before`,
/// restores them and jumps to the function it returned, or returns NULL.
macro_rules! dl_stub {
    ($before:path) => {
        core::arch::naked_asm!(
            "push rdi",
            "push rsi",
            "push rdx",
            "call {before}",
            "pop rdx",
            "pop rsi",
            "pop rdi",
            "test rax, rax",
            "jz 2f",
            "jmp rax",
            "2:",
            "xor eax, eax",
            "ret",
            before = sym $before,
        )
    };
}

/// Interposes `dlopen` so that the sled watcher thread starts only when a
/// program loads a library (`fastinst::sled`): a thread of its own, even one
/// that sleeps, switches glibc to its multi-threaded mode for good, with a
/// locked instruction pair in every `malloc` and `free` that misses the
/// thread cache (+1.4% instructions on QuickJS, 10-20% more CPU time in
/// interleaved runs here).
///
/// A stub, not a Rust function: glibc resolves a relative name against the
/// *caller's* `DT_RUNPATH` and `$ORIGIN`, which it finds from the return
/// address. The stub keeps the caller's on the stack and jumps to glibc's
/// `dlopen` after the call above, with the arguments as they came.
///
/// # Safety
/// As `dlopen(3)`.
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn dlopen(file: *const std::ffi::c_char, mode: c_int) -> *mut c_void {
    dl_stub!(before_dlopen)
}

/// Interposes `dlmopen` as [`dlopen`] is.
///
/// # Safety
/// As `dlmopen(3)`.
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn dlmopen(lmid: libc::Lmid_t, file: *const std::ffi::c_char, mode: c_int) -> *mut c_void {
    dl_stub!(before_dlmopen)
}

type DlcloseFn = unsafe extern "C" fn(*mut c_void) -> c_int;

fn real_dlclose() -> Option<DlcloseFn> {
    static REAL: OnceLock<usize> = OnceLock::new();
    // SAFETY: RTLD_NEXT lookup of a libc symbol.
    let p = *REAL.get_or_init(|| unsafe { libc::dlsym(libc::RTLD_NEXT, c"dlclose".as_ptr()) } as usize);
    // SAFETY: a non-null `dlclose` symbol has this signature.
    (p != 0).then(|| unsafe { std::mem::transmute::<usize, DlcloseFn>(p) })
}

/// Interposes `dlclose`: the probes of a library that is unloaded are
/// marked unloaded before its code goes away ([`fastinst::process::dlclose`]).
///
/// # Safety
/// As `dlclose(3)`.
#[no_mangle]
pub unsafe extern "C" fn dlclose(handle: *mut c_void) -> c_int {
    let Some(real) = real_dlclose() else { return -1 };
    // SAFETY: the caller's handle and glibc's dlclose, as required.
    unsafe { fastinst::process::dlclose(real, handle) }
}
