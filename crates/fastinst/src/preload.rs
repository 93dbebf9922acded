//! What `LD_PRELOAD=libfastinst.so` does: read the environment, start the
//! tool and the client, write reports at exit, keep working across fork
//! and `dlclose`.
//!
//! The variables it reads, their values and defaults are listed once, in
//! the README's table of settings; each is parsed where it is used
//! (`tools`, `profile::Settings::from_env`, `wordpatch`), and an invalid
//! value is reported on stderr and its default used.

use crate::discovery::{forget_modules, with_state, STATE};
use crate::log;
use crate::probe::Strategy;
use crate::registry;
use crate::tools::{self, Tool};
use std::ffi::{c_int, c_void, CStr, CString};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::OnceLock;

static TOOL: AtomicU8 = AtomicU8::new(0);
static OUT: OnceLock<PathBuf> = OnceLock::new();

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn parse_or_warn<T: std::str::FromStr<Err = String>>(name: &str, default: T) -> T {
    match env(name) {
        None => default,
        Some(v) => v.parse().unwrap_or_else(|e| {
            log::error(format_args!("{name}: {e}; using the default"));
            default
        }),
    }
}

/// True when this code runs from a shared object (the preload library),
/// not linked into the executable.
fn in_shared_object() -> bool {
    let mut ours: libc::Dl_info = unsafe_zeroed();
    let mut main: libc::Dl_info = unsafe_zeroed();
    // SAFETY: dladdr only reads the address and fills the struct.
    let a = unsafe { libc::dladdr(ctor as *const c_void, &mut ours) };
    // SAFETY: getauxval has no preconditions.
    let phdr = unsafe { libc::getauxval(libc::AT_PHDR) };
    // SAFETY: as above.
    let b = unsafe { libc::dladdr(phdr as *const c_void, &mut main) };
    a != 0 && b != 0 && ours.dli_fbase != main.dli_fbase
}

fn unsafe_zeroed() -> libc::Dl_info {
    libc::Dl_info {
        dli_fname: std::ptr::null(),
        dli_fbase: std::ptr::null_mut(),
        dli_sname: std::ptr::null(),
        dli_saddr: std::ptr::null_mut(),
    }
}

extern "C" fn ctor() {
    if !in_shared_object() {
        return;
    }
    let _ = std::panic::catch_unwind(start);
}

#[used]
#[link_section = ".init_array"]
static CTOR: extern "C" fn() = ctor;

fn start() {
    let began = wordpatch::tsc::now();
    if let Some(l) = env("FASTINST_LOG") {
        match log::parse_level(&l) {
            Some(l) => log::set_level(l),
            None => log::error(format_args!(
                "FASTINST_LOG: `{l}` is not a level (error, warn, info, debug); using warn"
            )),
        }
    }
    if let Some(v) = env("FASTINST_REWRITE") {
        match v.as_str() {
            "0" => crate::discovery::REWRITE.store(false, Ordering::Relaxed),
            "1" => {}
            _ => log::error(format_args!("FASTINST_REWRITE: `{v}` is not 0 or 1; using 1")),
        }
    }
    // The wait of straddling patches, resolved now, while the process has
    // one thread: with SyncCore that registers for membarrier, and the
    // kernel makes a registration wait out an RCU grace period once a
    // second thread shares the memory (none while there is one). Left to
    // the first straddling patch, it landed after the profiler's sampler
    // had started: SQLite's first straddling argument rewrite took 6.5 ms,
    // and a profiled run's start-up 8-17 ms more than the floor's.
    let (wait, source) = wordpatch::default_wait();
    log::debug(format_args!("straddler wait {wait:?} ({source:?})"));
    crate::set_strategy(parse_or_warn::<Strategy>("FASTINST_STRATEGY", Strategy::Flip));
    let tool = parse_or_warn::<Tool>("FASTINST_TOOL", Tool::Profile);
    TOOL.store(tool as u8, Ordering::Relaxed);
    let out = PathBuf::from(env("FASTINST_OUT").unwrap_or_else(|| ".".into()));
    let out = match std::fs::create_dir_all(&out) {
        Ok(()) => out,
        Err(e) => {
            log::error(format_args!(
                "FASTINST_OUT: cannot create {}: {e}; using .",
                out.display()
            ));
            PathBuf::from(".")
        }
    };
    let _ = OUT.set(out);
    // SAFETY: the three handlers are async-signal-safe enough for fork:
    // they only take and release locks this library owns.
    unsafe { libc::pthread_atfork(Some(fork_prepare), Some(fork_parent), Some(fork_child)) };
    // SAFETY: at_exit is a plain extern "C" fn.
    unsafe { libc::atexit(at_exit) };
    let ticks = crate::discovery::init();
    crate::stats::MODULES_TICKS.fetch_add(ticks, Ordering::Relaxed);
    log::info(format_args!("modules and symbols read in {ticks} ticks"));
    let t0 = wordpatch::tsc::now();
    let sleds = crate::sled::load();
    if sleds.functions > 0 {
        crate::sled::watch_from_first_dlopen();
        log::info(format_args!(
            "{} patchable entries in {} modules registered ({} normalised) in {} ticks",
            sleds.functions,
            sleds.modules,
            sleds.normalised,
            wordpatch::tsc::now().wrapping_sub(t0)
        ));
    }
    let out_dir = OUT.get().cloned().unwrap_or_else(|| PathBuf::from("."));
    if let Err(e) = tools::install(tool, &out_dir) {
        log::error(format_args!("FASTINST_TOOL: {e}"));
    }
    if let Some(client) = env("FASTINST_CLIENT") {
        load_client(&client);
    }
    log::info(format_args!(
        "started: tool {tool:?}, strategy {}, in {} ticks",
        crate::strategy().name(),
        wordpatch::tsc::now().wrapping_sub(began)
    ));
}

fn load_client(path: &str) {
    let Ok(c) = CString::new(path) else {
        log::error(format_args!("FASTINST_CLIENT: path contains NUL"));
        return;
    };
    // SAFETY: a NUL-terminated path; dlopen has no other preconditions.
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    if h.is_null() {
        // SAFETY: dlerror returns NULL or a NUL-terminated message.
        let msg = unsafe { libc::dlerror() };
        let msg = if msg.is_null() {
            "unknown error".into()
        } else {
            // SAFETY: non-null dlerror result is a C string.
            unsafe { CStr::from_ptr(msg) }.to_string_lossy().into_owned()
        };
        log::error(format_args!(
            "FASTINST_CLIENT: cannot load {path}: {msg}; running without a client"
        ));
        return;
    }
    // SAFETY: a valid handle and a NUL-terminated symbol name.
    let init = unsafe { libc::dlsym(h, c"fastinst_client_init".as_ptr()) };
    if init.is_null() {
        log::error(format_args!(
            "FASTINST_CLIENT: {path} has no `int fastinst_client_init(void)`; running without a client"
        ));
        return;
    }
    // SAFETY: the client's documented entry point has this signature.
    let init: extern "C" fn() -> c_int = unsafe { std::mem::transmute(init) };
    let rc = init();
    if rc != 0 {
        log::warn(format_args!("FASTINST_CLIENT: fastinst_client_init returned {rc}"));
    }
}

extern "C" fn at_exit() {
    // The program is done with its heap: the reports' many blocks come
    // from the system allocator, which reuses memory better (see `heap`).
    crate::heap::hand_over();
    let _ = std::panic::catch_unwind(|| {
        let s = crate::stats();
        if s.probes > 0 {
            log::info(format_args!(
                "{} probes ({} unrecognised, {} with the id passed in the argument); discovery {} ticks per run over {} runs",
                s.probes,
                s.unrecognised,
                s.arg_rewritten,
                s.discovery_ticks / s.discoveries.max(1),
                s.discoveries
            ));
        }
        // One fixed-format line that tools parse (fastinst-eval's Table 1).
        log::info(format_args!(
            "init total {} ticks (modules {}, sleds {}, discovery {})",
            s.init_ticks(),
            s.modules_ticks,
            s.sled_load_ticks,
            s.discovery_ticks
        ));
        if TOOL.load(Ordering::Relaxed) == Tool::Profile as u8 {
            crate::profile::write_reports(false);
        }
        if TOOL.load(Ordering::Relaxed) == Tool::Trace as u8 {
            crate::trace::write_reports();
        }
        if TOOL.load(Ordering::Relaxed) == Tool::Count as u8 {
            let dir = OUT.get().cloned().unwrap_or_else(|| PathBuf::from("."));
            match tools::write_counts(&dir) {
                Ok(Some(p)) => eprintln!("fastinst: call counts written to {}", p.display()),
                Ok(None) => {}
                Err(e) => log::error(format_args!("cannot write call counts to {}: {e}", dir.display())),
            }
        }
    });
}

extern "C" fn fork_prepare() {
    // Nothing may hold the discovery lock or a probe lock in the child.
    std::mem::forget(STATE.lock());
    crate::profile::fork_prepare();
    for p in registry::iter() {
        std::mem::forget(p.lock());
    }
}

fn fork_release() {
    for p in registry::iter() {
        p.lock.store(false, Ordering::Release);
    }
    // SAFETY: fork_prepare locked it on this thread and forgot the guard.
    unsafe { STATE.force_unlock() };
}

extern "C" fn fork_parent() {
    crate::profile::fork_parent();
    fork_release();
}

extern "C" fn fork_child() {
    // The child is this one thread until it returns from fork, so the locks
    // can go first: the profiler switches probes back on here.
    fork_release();
    crate::profile::fork_child();
    crate::sled::watch_after_fork();
    if TOOL.load(Ordering::Relaxed) == Tool::Count as u8 {
        tools::reset_counts();
    }
    if TOOL.load(Ordering::Relaxed) == Tool::Trace as u8 {
        crate::trace::fork_child();
    }
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
    crate::sled::library_loading();
    real_symbol(&REAL, c"dlopen")
}

/// As [`before_dlopen`], for `dlmopen`.
extern "C" fn before_dlmopen() -> usize {
    static REAL: AtomicUsize = AtomicUsize::new(0);
    crate::sled::library_loading();
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
/// program loads a library ([`crate::sled`]): a thread of its own, even one
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
/// marked unloaded *before* its code goes away (toggles fail with
/// `Unloaded` from then on) and their site keys and pages are forgotten.
/// If the library stays loaded (other references), the marks are undone.
///
/// # Safety
/// As `dlclose(3)`.
#[no_mangle]
pub unsafe extern "C" fn dlclose(handle: *mut c_void) -> c_int {
    let Some(real) = real_dlclose() else { return -1 };
    let mut lm: *mut libc::c_void = std::ptr::null_mut();
    // SAFETY: dlinfo with RTLD_DI_LINKMAP writes a `struct link_map *`.
    let bias = if unsafe { libc::dlinfo(handle, libc::RTLD_DI_LINKMAP, &mut lm as *mut _ as *mut c_void) } == 0
        && !lm.is_null()
    {
        // SAFETY: l_addr is the first field of glibc's public link_map.
        Some(unsafe { *(lm as *const u64) })
    } else {
        None
    };
    let module = bias.and_then(|b| {
        let s = STATE.lock();
        s.as_ref()?
            .modules
            .loaded
            .iter()
            .find(|m| m.bias == b && b != 0)
            .map(|m| m.index)
    });
    let mark = |v: bool| {
        if let Some(ix) = module {
            for p in registry::iter().filter(|p| p.module == ix) {
                let _g = p.lock();
                p.unloaded.store(v, Ordering::Release);
            }
        }
    };
    mark(true);
    // SAFETY: forwarded.
    let rc = unsafe { real(handle) };
    let still = with_state(|s| {
        let gone = s.rescan();
        forget_modules(&gone);
        module.is_some_and(|ix| s.modules.loaded.iter().any(|m| m.index == ix))
    });
    if still {
        mark(false);
    }
    rc
}
