//! The process around the runtime: starting it from the environment,
//! ending it with the tool's reports, keeping it whole across `fork`, and
//! the library events it must see (`dlopen`, `dlclose`). The preload
//! library (`fastinst-preload`) calls these from its constructor, its
//! `atexit` and `pthread_atfork` handlers and its interposed `dlopen` and
//! `dlclose`; a program that links this crate directly may call them too.

use crate::discovery::{forget_modules, with_state, STATE};
use crate::env::{env, parse_or_warn};
use crate::log;
use crate::probe::Strategy;
use crate::registry;
use crate::tools::{self, Tool};
use std::ffi::{c_int, c_void, CStr, CString};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Mutex;

static TOOL: AtomicU8 = AtomicU8::new(0);
/// The output directory of the tool running now (an attach after a detach
/// may name another).
static OUT: Mutex<Option<PathBuf>> = Mutex::new(None);

fn out_dir() -> PathBuf {
    OUT.lock()
        .ok()
        .and_then(|o| o.clone())
        .unwrap_or_else(|| PathBuf::from("."))
}

/// Starts the runtime as `LD_PRELOAD=libfastinst.so` does, configured by
/// the `FASTINST_*` variables (`docs/configuration.md`): log level,
/// strategy, tool, output directory, sleds, client. A program that links
/// this crate instead of preloading the library may call it once, early.
/// It never fails: an invalid setting is reported on stderr and its
/// default used. It does not register [`finish`] or the fork handlers:
/// the caller does (the preload library with `atexit` and
/// `pthread_atfork`). Run again in a process attached again after a
/// detach (`crate::attach`), it starts the tool then chosen: what was read
/// and registered before (modules, sleds, probes) is kept and only what is
/// new is added.
pub fn start_from_env() {
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
    // The wait of straddling patches, resolved before any patch: with
    // SyncCore that registers for membarrier, and the kernel makes a
    // registration wait out an RCU grace period once a second thread
    // shares the memory (none while there is one). Left to the first
    // straddling patch, it landed after the profiler's sampler had started
    // and made that patch, and the run's start-up, milliseconds longer.
    // Preloaded, the process has one thread until the tool starts, and it
    // costs nothing. In a process with threads each registration waits
    // out a grace period, this one and W^X's; attached, the runtime makes
    // threads of its own anyway (its control channel's), and a program of
    // one thread would still pay the first perf event's wait (`tools::prepare`).
    // So there it runs on a thread of its own, beside the modules' and sleds' reading, and is
    // joined before the tool arms any probe (the two waits in a row were a
    // good part of a first attach's start: `crates/benches/results/attach.md`).
    // W^X's own registration (its fork gate's) is made on that thread
    // too, first (the mode is set below, after the modules are read), and
    // so is what the tool's start would wait for (`tools::prepare`).
    let write_mode = match env("FASTINST_WX").as_deref() {
        None => None,
        Some("1") => Some(wordpatch::WriteMode::Alias),
        Some("0") => Some(wordpatch::WriteMode::InPlace),
        Some(v) => {
            log::error(format_args!("FASTINST_WX: `{v}` is not 0 or 1; using 0"));
            None
        }
    };
    let tool = parse_or_warn::<Tool>("FASTINST_TOOL", Tool::Profile);
    let threads = crate::rawthread::threads_in_process();
    if threads == 1 && crate::attached::get() {
        // The registrations first, while this is the only thread and they
        // wait for nothing; the thread then made has the perf event's wait
        // alone.
        if let Some(m) = write_mode {
            wordpatch::prepare_write_mode(m);
        }
        wordpatch::default_wait();
    }
    let resolving = if threads > 1 || crate::attached::get() {
        std::thread::Builder::new()
            .name("fastinst-wait".into())
            .spawn(move || {
                if let Some(m) = write_mode {
                    wordpatch::prepare_write_mode(m);
                }
                tools::prepare(tool);
                wordpatch::default_wait()
            })
            .ok()
    } else {
        None
    };
    crate::set_strategy(parse_or_warn::<Strategy>("FASTINST_STRATEGY", Strategy::Flip));
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
    if let Ok(mut o) = OUT.lock() {
        *o = Some(out);
    }
    // W^X: chosen before any code page is made writable: reading the
    // modules makes none, and the mode is set before the discovery lock
    // goes, so no discovery makes one first. Pages made writable by an
    // earlier start (an attach before) keep their way.
    let ticks = crate::discovery::init(|| {
        if let Some(m) = write_mode {
            wordpatch::set_write_mode(m);
        }
    });
    crate::stats::MODULES_TICKS.fetch_add(ticks, Ordering::Relaxed);
    log::info(format_args!("modules and symbols read in {ticks} ticks"));
    let t0 = wordpatch::tsc::now();
    let sleds = crate::sled::load();
    if sleds.functions + sleds.points > 0 {
        crate::sled::watch_from_first_dlopen();
        log::info(format_args!(
            "{} sleds and {} points in {} modules registered ({} normalised, {} -pg calls rewritten) in {} ticks",
            sleds.functions,
            sleds.points,
            sleds.modules,
            sleds.normalised,
            sleds.rewritten,
            wordpatch::tsc::now().wrapping_sub(t0)
        ));
    }
    let joined = wordpatch::tsc::now();
    // Without the thread (one thread in the process, or none could be
    // made) it is resolved here, still before any probe is armed; the
    // result is kept, so a thread that failed leaves it to be resolved
    // here too.
    let (wait, source) = resolving
        .and_then(|h| h.join().ok())
        .unwrap_or_else(wordpatch::default_wait);
    log::debug(format_args!(
        "straddler wait {wait:?} ({source:?}); waited {} ticks for it after the sleds",
        wordpatch::tsc::now().wrapping_sub(joined)
    ));
    let out_dir = out_dir();
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

/// Whether the runtime was started in this process ([`start_from_env`]
/// ran: preloaded, or attached).
pub(crate) fn started() -> bool {
    OUT.lock().is_ok_and(|o| o.is_some())
}

/// The tool that settings `vars` (`KEY=VALUE` pairs) choose; the default
/// where they choose none or an invalid one, as [`start_from_env`] does.
pub(crate) fn tool_from(vars: &[(String, String)]) -> Tool {
    vars.iter()
        .find(|(k, v)| k == "FASTINST_TOOL" && !v.is_empty())
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(Tool::Profile)
}

/// The tool this process runs.
pub(crate) fn tool() -> Tool {
    match TOOL.load(Ordering::Relaxed) {
        t if t == Tool::Profile as u8 => Tool::Profile,
        t if t == Tool::Trace as u8 => Tool::Trace,
        t if t == Tool::Count as u8 => Tool::Count,
        t if t == Tool::Off as u8 => Tool::Off,
        _ => Tool::None,
    }
}

/// Ends the run: logs the runtime's counters and writes the tool's reports
/// (profile, trace or counts). Called once, at exit.
pub fn finish() {
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
        let undone = wordpatch::reprotections_undone();
        if undone > 0 {
            log::info(format_args!(
                "{undone} writes to code pages that another patcher had made read-only again were let through (wordpatch made the page writable again)"
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
        match tool() {
            Tool::Profile => crate::profile::write_reports(false),
            Tool::Trace => crate::trace::write_reports(),
            Tool::Count => {
                let dir = out_dir();
                match tools::write_counts(&dir) {
                    Ok(Some(p)) => eprintln!("fastinst: call counts written to {}", p.display()),
                    Ok(None) => {}
                    Err(e) => log::error(format_args!("cannot write call counts to {}: {e}", dir.display())),
                }
            }
            Tool::Off | Tool::None => {}
        }
    });
}

/// Before `fork`: takes every lock the runtime owns, so that none is held
/// in the child (`pthread_atfork`'s `prepare`).
pub fn fork_prepare() {
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

/// After `fork`, in the parent: releases what [`fork_prepare`] took.
pub fn fork_parent() {
    crate::profile::fork_parent();
    fork_release();
}

/// After `fork`, in the child: releases the locks, then restarts what the
/// child needs (the profiler's sampler, the sled watcher, fresh counts).
pub fn fork_child() {
    // The child is this one thread until it returns from fork, so the locks
    // can go first: the profiler switches probes back on here.
    fork_release();
    crate::profile::fork_child();
    crate::sled::watch_after_fork();
    match tool() {
        Tool::Count => tools::reset_counts(),
        Tool::Trace => crate::trace::fork_child(),
        _ => {}
    }
}

/// Before a library is loaded (the preload library's `dlopen` and
/// `dlmopen`): a program with sleds gets its sled watcher now, when it
/// first loads a library.
pub fn library_loading() {
    crate::sled::library_loading();
}

/// `dlclose(handle)` through `real` (glibc's): the probes of a library
/// that is unloaded are marked unloaded *before* its code goes away
/// (toggles fail with `Unloaded` from then on) and their site keys and
/// pages are forgotten. If the library stays loaded (other references),
/// the marks are undone. Returns what `real` returned.
///
/// # Safety
/// As `dlclose(3)`: `handle` came from `dlopen`; `real` is glibc's
/// `dlclose`.
pub unsafe fn dlclose(real: unsafe extern "C" fn(*mut c_void) -> c_int, handle: *mut c_void) -> c_int {
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
    // SAFETY: forwarded, as the caller's contract says.
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
