//! Self time from CPU samples: where the program counter is, every
//! half millisecond of each thread's CPU time.
//!
//! Self time cannot be read off sampled calls: a function's calls are
//! sampled a few per epoch, its callees' time must be taken off each one,
//! and the hooks that time them cost more than a short function takes.
//! Each thread that runs a hook gets a `cpu-clock` software event of its
//! own (`perf_event_open`, user space only, which an unprivileged process
//! may open on itself), the event `perf record` samples an uninstrumented
//! build with: every [`PERIOD_NS`] of the thread's CPU time the kernel
//! sends the thread `SIGTRAP` (the event's `sigtrap` mode), whose handler
//! notes the interrupted program counter, whether a
//! hook's handler was running, and the thread's place in the clock's table
//! (`super::uncharged` sets each thread's profiler time in its samples
//! beside its charge). At the report, each counter is charged to
//! the function holding it (an instrumented function's extent, or the
//! symbol found by `dladdr`); samples inside a handler, or in fastinst's
//! own library, are the profiler's own time and are left out of every
//! share.
//!
//! Where events cannot be opened (a container's seccomp filter, a kernel
//! before 5.13), a timer on the process's CPU time (`ITIMER_PROF`,
//! `SIGPROF`) takes its place: as unbiased,
//! but the kernel checks it at its scheduler tick, a few hundred samples a
//! second in all, too few to tell a short run's shares within a point or
//! two.
//!
//! The handler is async-signal-safe and allocates nothing: one atomic add
//! and one store into a buffer made at start ([`CAPACITY`] samples; past
//! it samples are counted, not kept, and the report says so). Its cost, a
//! signal a sample (microseconds in a virtual machine), sets the period. A
//! program that handles the signal itself (`gprof`'s runtime handles
//! `SIGPROF`) keeps its handler, and the report has no CPU samples.

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};

/// Marks a sample taken while a hook's handler ran (user addresses are
/// below 2^47).
pub const IN_HOOK: u64 = 1 << 63;

/// Where a kept sample notes its thread: bits 47-62, above every user
/// address, hold one more than the thread's place in the clock's table
/// (`crate::clock::thread`), 0 for a thread without a clock,
/// and [`THREAD_MAX`] for every thread from there on.
const THREAD_SHIFT: u32 = 47;
/// The largest thread tag; the program counter's bits below it.
const THREAD_MAX: u64 = (1 << 16) - 1;
const PC_MASK: u64 = (1 << THREAD_SHIFT) - 1;

/// One CPU sample as kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Sample {
    /// The interrupted program counter (its bits below 2^47: the legacy
    /// vsyscall page, the one user code above, reads as a low address that
    /// no module holds).
    pub(crate) pc: u64,
    /// Whether a hook's handler was running.
    pub(crate) in_hook: bool,
    /// The thread's place in the clock's table, where it had a clock and
    /// that place is below [`THREAD_MAX`] - 1.
    pub(crate) thread: Option<u32>,
}

/// A sample in one word: never 0 (an unwritten slot), for a program
/// counter is never 0.
fn encode(pc: u64, in_hook: bool, thread: Option<u32>) -> u64 {
    let tag = thread.map_or(0, |i| (u64::from(i) + 1).min(THREAD_MAX));
    pc & PC_MASK | tag << THREAD_SHIFT | if in_hook { IN_HOOK } else { 0 }
}

fn decode(word: u64) -> Sample {
    let tag = (word & !IN_HOOK) >> THREAD_SHIFT;
    Sample {
        pc: word & PC_MASK,
        in_hook: word & IN_HOOK != 0,
        thread: (tag != 0 && tag != THREAD_MAX).then(|| (tag - 1) as u32),
    }
}

/// Samples kept.
pub const CAPACITY: usize = 1 << 22;

/// The sampling period of a thread's event (nanoseconds of its CPU time):
/// 2,000 samples a CPU second, a share's standard deviation under a point
/// in a one-second run, for a signal per sample.
pub const PERIOD_NS: u64 = 500_000;

/// The interval of the process timer used without events (microseconds
/// of CPU time); prime, so that it keeps no step with a periodic program.
pub const INTERVAL_US: i64 = 997;

/// How samples are taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Mode {
    /// Not taken.
    Off = 0,
    /// A `cpu-clock` event per thread.
    Events = 1,
    /// The process's `ITIMER_PROF`.
    Timer = 2,
}

static MODE: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// How samples are being taken.
pub fn mode() -> Mode {
    match MODE.load(Ordering::Relaxed) {
        1 => Mode::Events,
        2 => Mode::Timer,
        _ => Mode::Off,
    }
}

/// The sampling interval in microseconds of CPU time.
pub fn interval_us() -> f64 {
    match mode() {
        Mode::Events => PERIOD_NS as f64 / 1e3,
        _ => INTERVAL_US as f64,
    }
}

static BUF: AtomicUsize = AtomicUsize::new(0);
static NEXT: AtomicU64 = AtomicU64::new(0);
static ON: AtomicBool = AtomicBool::new(false);

/// Threads whose event descriptors are kept, to be closed at a detach
/// (past it, a thread's event stays open for its life, as it always does
/// at exit).
const KEPT_EVENTS: usize = 4096;
/// The threads' event descriptors (0: free slot), and how many slots were
/// taken. A fixed array: a thread opens its event in its first hook,
/// which must not allocate.
static EVENTS: [AtomicI32; KEPT_EVENTS] = [const { AtomicI32::new(0) }; KEPT_EVENTS];
static EVENTS_TAKEN: AtomicUsize = AtomicUsize::new(0);

/// Keeps descriptor `fd` for [`close_events`].
fn keep_event(fd: i32) {
    let i = EVENTS_TAKEN.fetch_add(1, Ordering::Relaxed);
    if let Some(slot) = EVENTS.get(i) {
        slot.store(fd, Ordering::Release);
    }
}

/// Stops sampling for good and closes every thread's event (a detach:
/// nothing of the profiler may keep firing in the process). Events of
/// threads past [`KEPT_EVENTS`] stay open, disabled by [`stop`]'s flag.
pub(crate) fn close_events() {
    stop();
    let n = EVENTS_TAKEN.load(Ordering::Acquire).min(KEPT_EVENTS);
    for slot in &EVENTS[..n] {
        let fd = slot.swap(0, Ordering::AcqRel);
        if fd > 0 {
            // SAFETY: `fd` is an event descriptor this module opened and
            // nothing else holds or closes.
            unsafe { libc::close(fd) };
        }
    }
    // The slots are free for a later generation's events (an attach after
    // a detach) unless some events could not be kept.
    if EVENTS_TAKEN.load(Ordering::Acquire) <= KEPT_EVENTS {
        EVENTS_TAKEN.store(0, Ordering::Release);
    }
}

/// Starts sampling (once per process; again in a forked child, whose
/// timers were reset). Whether the samples are being taken.
pub(crate) fn start() -> bool {
    // Looked up here, on a thread the C library knows, for the sampler's
    // tallies (`tally_since`), which may run on one it does not.
    own_library();
    if BUF.load(Ordering::Acquire) == 0 {
        // A fresh mapping is zero (each slot an `AtomicU64` of 0) and costs
        // nothing until a sample lands on its page: written zero by the
        // program, its 32 MiB faulted in every page, a good part of the
        // profiler's start.
        match crate::mapping::map(
            CAPACITY * std::mem::size_of::<AtomicU64>(),
            libc::PROT_READ | libc::PROT_WRITE,
        ) {
            Ok(buf) => BUF.store(buf, Ordering::Release),
            Err(e) => {
                crate::log::warn(format_args!("profile: no memory for CPU samples ({e}); none taken"));
                return false;
            }
        }
    }
    // Events (SIGTRAP) first, the process timer (SIGPROF) where there are
    // none; the handler is installed before the event opens. What a signal
    // costs its thread is measured once, before samples are on
    // (`super::signalcost`).
    if install(libc::SIGTRAP) {
        if super::signalcost::ticks() == 0
            && measure(|| {
                super::signalcost::periodic(libc::SIGTRAP, || {
                    open_cpu_clock(super::signalcost::PERIOD_NS, PERF_SAMPLE_IP, FLAGS)
                })
            })
            .is_none()
        {
            unmeasured();
        }
        ON.store(true, Ordering::Release);
        MODE.store(Mode::Events as u8, Ordering::Release);
        if open_event() {
            return true;
        }
        MODE.store(Mode::Off as u8, Ordering::Release);
        ON.store(false, Ordering::Release);
    }
    if !install(libc::SIGPROF) {
        return false;
    }
    if super::signalcost::ticks() == 0 && measure(|| super::signalcost::sent(libc::SIGPROF)).is_none() {
        unmeasured();
    }
    let tv = libc::timeval {
        tv_sec: 0,
        tv_usec: INTERVAL_US,
    };
    let it = libc::itimerval {
        it_interval: tv,
        it_value: tv,
    };
    ON.store(true, Ordering::Release);
    MODE.store(Mode::Timer as u8, Ordering::Release);
    // SAFETY: setitimer reads `it`.
    let ok = unsafe { libc::setitimer(libc::ITIMER_PROF, &it, std::ptr::null_mut()) } == 0;
    if !ok {
        MODE.store(Mode::Off as u8, Ordering::Release);
        ON.store(false, Ordering::Release);
    }
    ok
}

/// Runs a measurement of what a signal costs (`super::signalcost`) on a
/// thread that stands for the program's.
///
/// Attached, the profiler starts on one of the program's threads that the
/// attaching command traces for the while: each signal there stops the
/// thread for its tracer, and a measurement on it read several times
/// what a signal costs the program's threads once the command has let
/// them go. A thread of its own is not traced. Preloaded, the measurement
/// stays on the starting thread: a first thread would switch the C
/// library of a single-threaded program to its slower locked paths for
/// the rest of the run (`crate::rawthread`), and a program run under a
/// debugger has every thread traced, so there the traced cost is the
/// program's.
fn measure(run: impl FnOnce() -> Option<u64> + Send) -> Option<u64> {
    if !crate::attached::get() {
        return run();
    }
    std::thread::scope(|s| {
        std::thread::Builder::new()
            .name("fastinst-signals".into())
            .spawn_scoped(s, run)
            .ok()
            .and_then(|h| h.join().ok())
            .flatten()
    })
}

/// Says that the samples' signals go uncharged (the report says it too).
fn unmeasured() {
    crate::log::warn(format_args!(
        "profile: what a sampling signal costs could not be measured; durations hold it"
    ));
}

/// Installs the sampling handler for `sig`, unless the program handles it;
/// whether it is installed.
fn install(sig: libc::c_int) -> bool {
    // SAFETY: reads the current disposition into a zeroed struct.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: a null new action only queries.
    if unsafe { libc::sigaction(sig, std::ptr::null(), &mut old) } != 0 {
        return false;
    }
    // The patching protocol's own SIGTRAP handler (installed by a
    // straddling patch before the profiler started: a `-pg` call
    // rewritten at start-up) chains to what it replaced, so it goes back
    // on top of the sampler's.
    let patcher_first = sig == libc::SIGTRAP && wordpatch::trap_handler_is_current();
    if old.sa_sigaction != libc::SIG_DFL && old.sa_sigaction != on_sample as *const () as usize && !patcher_first {
        crate::log::warn(format_args!(
            "profile: the program handles signal {sig}; no CPU samples from it"
        ));
        return false;
    }
    // SAFETY: installs a handler that is async-signal-safe (see
    // `on_sample`), with SA_RESTART so that no system call of the program
    // fails with EINTR for it.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sample as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        if libc::sigaction(sig, &sa, std::ptr::null_mut()) != 0 {
            return false;
        }
    }
    if patcher_first {
        if let Err(e) = wordpatch::install_trap_handler() {
            crate::log::warn(format_args!("profile: the patching protocol's SIGTRAP handler: {e}"));
        }
    }
    true
}

/// Whether the sampling signal still reaches [`on_sample`]: a program that
/// installs its own handler for it after the samples began takes their
/// signals from then on, and no sample is kept past that. True while no
/// samples are taken. (The patching protocol's `SIGTRAP` handler passes
/// on what is not its own.)
pub(crate) fn handler_kept() -> bool {
    let sig = match mode() {
        Mode::Off => return true,
        Mode::Events => libc::SIGTRAP,
        Mode::Timer => libc::SIGPROF,
    };
    // SAFETY: reads the current disposition into a zeroed struct.
    let mut cur: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: a null new action only queries.
    if unsafe { libc::sigaction(sig, std::ptr::null(), &mut cur) } != 0 {
        return true;
    }
    cur.sa_sigaction == on_sample as *const () as usize
        || (sig == libc::SIGTRAP && wordpatch::trap_handler_is_current())
}

/// A thread's first hook: its own event, when samples are taken by events.
pub(crate) fn thread_start() {
    if ON.load(Ordering::Acquire) && mode() == Mode::Events {
        open_event();
    }
}

/// `perf_event_attr` (its first 128 bytes, the size of version 7).
#[repr(C)]
struct PerfAttr([u64; 16]);

const PERF_TYPE_SOFTWARE: u64 = 1;
const PERF_COUNT_SW_CPU_CLOCK: u64 = 0;
const PERF_SAMPLE_IP: u64 = 1;
/// `exclude_kernel`, `exclude_hv`, `remove_on_exec`, `sigtrap`: the
/// kernel sends the thread `SIGTRAP` itself at every overflow.
const FLAGS: u64 = 1 << 5 | 1 << 6 | 1 << 36 | 1 << 37;
/// `si_code` of an event's `SIGTRAP`.
const TRAP_PERF: i32 = 6;
const PERF_FLAG_FD_CLOEXEC: usize = 8;

/// Opens and closes a counting event that never samples, so that the
/// thread's own sampling event opens at once later.
///
/// Why: while no thread of the whole system has a perf event, the first
/// to open one waits for the kernel to switch its perf hooks on
/// (milliseconds), and the kernel keeps them on for a while after the last
/// event closes. A start (an attach
/// above all, where every thread competes for the CPUs) paid that inside
/// [`start`]; done on another thread while the start reads the modules,
/// it costs the start nothing.
pub(crate) fn prepare() {
    // `disabled` (the flags' first bit): it never counts, let alone samples.
    let fd = open_cpu_clock(0, 0, 1);
    if fd >= 0 {
        // SAFETY: the descriptor just opened, owned here alone.
        unsafe { libc::close(fd as i32) };
    }
}

/// Opens a CPU-clock event of this thread with the attribute's sample
/// period, sample type and flags words: its descriptor, or a negative
/// error.
fn open_cpu_clock(period: u64, sample_type: u64, flags: u64) -> isize {
    let mut attr = PerfAttr([0; 16]);
    attr.0[0] = PERF_TYPE_SOFTWARE | (128u64 << 32);
    attr.0[1] = PERF_COUNT_SW_CPU_CLOCK;
    attr.0[2] = period;
    attr.0[3] = sample_type;
    attr.0[5] = flags;
    // SAFETY: perf_event_open reads `attr` (128 bytes); pid 0 is this
    // thread, cpu -1 any, no group.
    unsafe {
        crate::arch::cpu::syscall(
            libc::SYS_perf_event_open,
            &attr as *const PerfAttr as usize,
            0,
            usize::MAX,
            usize::MAX,
            PERF_FLAG_FD_CLOEXEC,
        )
    }
}

/// Opens a `cpu-clock` event on the calling thread that sends it
/// `SIGTRAP` every [`PERIOD_NS`] of its CPU time; whether it did. The
/// descriptor stays open for the thread's life (its event with it).
fn open_event() -> bool {
    let generation = super::profiler::generation();
    if OPENED.with(|o| o.replace(generation)) == generation {
        return true;
    }
    let fd = open_cpu_clock(PERIOD_NS, PERF_SAMPLE_IP, FLAGS);
    if fd < 0 {
        OPENED.with(|o| o.set(0));
    } else {
        keep_event(fd as i32);
    }
    fd >= 0
}

thread_local! {
    /// The profiler generation this thread has its event for (one a
    /// thread: two would double its samples; 0: none). A detach closes
    /// every event, so a thread opens one again for the next generation.
    static OPENED: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Forgets this thread's event (a forked child's thread has none).
fn forget_event() {
    OPENED.with(|o| o.set(0));
}

/// Stops sampling (the report is being made).
pub(crate) fn stop() {
    if ON.swap(false, Ordering::AcqRel) && mode() == Mode::Timer {
        let zero = libc::itimerval {
            it_interval: libc::timeval { tv_sec: 0, tv_usec: 0 },
            it_value: libc::timeval { tv_sec: 0, tv_usec: 0 },
        };
        // SAFETY: setitimer reads `zero`.
        unsafe { libc::setitimer(libc::ITIMER_PROF, &zero, std::ptr::null_mut()) };
    }
}

/// Forgets the samples (a forked child profiles its own time).
pub(crate) fn reset() {
    NEXT.store(0, Ordering::Release);
    forget_event();
}

extern "C" fn on_sample(_: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // Async-signal-safe: reads the interrupted context and two static
    // thread-local words, one atomic add, one atomic store, and charges
    // the signal to the thread's clock (atomics of its own record); no
    // system call, no allocation, no lock.
    if ctx.is_null() || info.is_null() {
        return;
    }
    // SAFETY: the kernel passes a siginfo_t.
    let (signo, code) = unsafe { ((*info).si_signo, (*info).si_code) };
    if signo == libc::SIGTRAP && code != TRAP_PERF {
        // Not ours (a breakpoint): nothing to note.
        return;
    }
    if !ON.load(Ordering::Relaxed) {
        // Stopped (an event stays disabled once it has fired), or not yet
        // on: a signal whose cost is being measured.
        super::signalcost::count();
        return;
    }
    // SAFETY: with SA_SIGINFO the kernel passes a ucontext_t.
    let pc = unsafe { (*(ctx as *const libc::ucontext_t)).uc_mcontext.gregs[libc::REG_RIP as usize] } as u64;
    let thread = (crate::arch::tls::sample_tag() as u32).checked_sub(1);
    let word = encode(pc, crate::arch::tls::guard_get(), thread);
    let i = NEXT.fetch_add(1, Ordering::Relaxed) as usize;
    let buf = BUF.load(Ordering::Acquire) as *const AtomicU64;
    if i < CAPACITY && !buf.is_null() {
        // SAFETY: `buf` holds CAPACITY slots for the life of the process.
        unsafe { (*buf.add(i)).store(word, Ordering::Relaxed) };
    }
    super::signalcost::charge();
}

/// The samples kept, and how many were taken in all.
pub(crate) fn samples() -> (Vec<Sample>, u64) {
    let n = NEXT.load(Ordering::Acquire);
    let buf = BUF.load(Ordering::Acquire) as *const AtomicU64;
    if buf.is_null() {
        return (Vec::new(), 0);
    }
    let kept = (n as usize).min(CAPACITY);
    // SAFETY: as in the handler; slots below `kept` were written (or are
    // being: a zero is skipped).
    let v = (0..kept)
        .map(|i| unsafe { (*buf.add(i)).load(Ordering::Relaxed) })
        .filter(|&w| w != 0)
        .map(decode)
        .collect();
    (v, n)
}

/// The slot the next kept sample takes (or [`CAPACITY`], once full).
pub(crate) fn next_slot() -> u64 {
    NEXT.load(Ordering::Acquire).min(CAPACITY as u64)
}

/// The samples kept in slots `[from, ..)` so far: where the next tally
/// begins, how many there were, and how many of them were in the
/// profiler's code (a hook's handler, or fastinst's own library).
///
/// For the sampler thread at each epoch's end, which may be one the C
/// library does not know: it reads the slots and takes no lock, and
/// allocates nothing. The library's range is the one [`start`] looked up;
/// a sample in a counting stub counts as the program's here (the stubs'
/// areas are behind a lock), so the tally errs towards the program.
pub(crate) fn tally_since(from: u64) -> (u64, u64, u64) {
    let buf = BUF.load(Ordering::Acquire) as *const AtomicU64;
    let to = next_slot();
    if buf.is_null() || from >= to {
        return (from.max(to), 0, 0);
    }
    let (lo, hi) = OWN_LIBRARY.get().copied().unwrap_or((0, 0));
    let (mut n, mut own) = (0, 0);
    for i in from..to {
        // SAFETY: as in `samples`.
        let w = unsafe { (*buf.add(i as usize)).load(Ordering::Relaxed) };
        if w == 0 {
            // A slot being written: skipped, as the report skips it.
            continue;
        }
        let s = decode(w);
        n += 1;
        if s.in_hook || (lo..hi).contains(&s.pc) {
            own += 1;
        }
    }
    (to, n, own)
}

/// [`own_library`]'s range, once looked up.
static OWN_LIBRARY: std::sync::OnceLock<(u64, u64)> = std::sync::OnceLock::new();

/// The address range of fastinst's own code when it is a library of its
/// own (`libfastinst.so`), for leaving the profiler's time out; empty when
/// it is linked into the program (its functions then show by name).
pub(crate) fn own_library() -> (u64, u64) {
    *OWN_LIBRARY.get_or_init(|| {
        // SAFETY: Dl_info is plain pointers, for which all zeroes is valid.
        let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
        // SAFETY: dladdr reads the address and fills `info`.
        if unsafe { libc::dladdr(own_library as *const libc::c_void, &mut info) } == 0 || info.dli_fname.is_null() {
            return (0, 0);
        }
        // SAFETY: dladdr returned a NUL-terminated name.
        let name = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) }
            .to_string_lossy()
            .into_owned();
        if !name.ends_with(".so") && !name.contains(".so.") {
            return (0, 0);
        }
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
        let (mut lo, mut hi) = (u64::MAX, 0);
        for line in maps.lines().filter(|l| l.ends_with(name.as_str())) {
            let Some((a, b)) = line.split_whitespace().next().and_then(|r| r.split_once('-')) else {
                continue;
            };
            if let (Ok(a), Ok(b)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) {
                lo = lo.min(a);
                hi = hi.max(b);
            }
        }
        if lo < hi {
            (lo, hi)
        } else {
            (0, 0)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sample_keeps_its_counter_its_thread_and_whether_a_handler_ran() {
        let pc = 0x7f12_3456_789a;
        for in_hook in [false, true] {
            for thread in [None, Some(0), Some(1), Some(70_000), Some(THREAD_MAX as u32 - 2)] {
                let w = encode(pc, in_hook, thread);
                assert_ne!(w, 0);
                let want = thread.filter(|&i| u64::from(i) + 1 < THREAD_MAX);
                assert_eq!(
                    decode(w),
                    Sample {
                        pc,
                        in_hook,
                        thread: want
                    },
                    "{thread:?}"
                );
            }
        }
        // The vsyscall page's counter loses its high bits, never the
        // thread's or the handler's mark.
        let s = decode(encode(0xffff_ffff_ff60_0000, true, Some(3)));
        assert_eq!((s.in_hook, s.thread), (true, Some(3)));
        assert!(s.pc < 1 << 47);
    }

    #[test]
    fn linked_into_a_program_fastinst_is_no_library_of_its_own() {
        // The test binary links fastinst in: its functions are charged by
        // name, not dropped with the whole program.
        assert_eq!(own_library(), (0, 0));
    }
}
