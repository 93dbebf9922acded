//! The trace tool (`FASTINST_TOOL=trace`): every call of every function
//! timed. It is the exact reference the profiler's estimates are checked
//! against, and a tool of its own for short runs, as uftrace is.
//!
//! Every entry and exit probe stays on. Each thread keeps a stack of its
//! open calls, paired by the function's CFA as the profiler pairs them
//! (`crate::hooks::cfa`). A call's duration is the program's own time
//! between its entry and its exit ([`crate::clock`]): the hooks' time, its
//! own and every nested call's, is taken off, so a function's numbers are
//! what they would be without the tool, up to what the hooks do to the
//! caches. Per function it keeps:
//! - calls (entries, exact);
//! - inclusive time, counted once per outermost activation: a call made
//!   while another activation of the same function is open on the thread
//!   adds nothing (its time is already in the outer one), so recursion never
//!   counts time twice;
//! - self time: each call's duration less its direct callees', all
//!   activations (wall time: it includes time in uninstrumented callees
//!   and time blocked);
//! - every duration in a histogram of 128 buckets per power of two (under
//!   0.4% wide), for percentiles;
//! - caller -> callee edges: calls, and the time of the calls made by an
//!   outermost activation of the caller, so that a caller's edges never sum
//!   past its inclusive time.
//!
//! Calls still open when their thread exits, or when the process writes
//! the report at exit (`main`, thread bodies), are closed then, and counted
//! as such.
//!
//! It also keeps a timeline: each call as a slice on its thread's track,
//! written as Chrome trace-event JSON for Perfetto
//! (`fastinst_report::timeline`), the first `FASTINST_TIMELINE` calls to
//! end ([`crate::timeline`]), and how many more there were.

use crate::clock;
use crate::hooks;
use crate::probe::{ProbeId, ProbeKind, ProbeMeta};
use crate::profile::hist::Hist;
use crate::profile::report::{EdgeRow, FunctionRow, Overhead, Range, Report, SettingsOut, Stacks};
use crate::registry;
use crate::segmented::Segmented;
use fastinst_report::timeline::Timeline;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;
use wordpatch::tsc;

/// The trace's histograms: 128 buckets per power of two.
type FineHist = Hist<7>;

/// Deepest stack of open calls kept per thread; deeper calls are counted
/// and not timed.
const MAX_DEPTH: usize = 1 << 16;

/// A function's record.
struct Func {
    addr: usize,
    name: std::borrow::Cow<'static, str>,
}

/// An open call.
#[derive(Clone, Copy)]
struct Frame {
    func: u32,
    /// The entry probe it came through.
    entry: ProbeId,
    cfa: u64,
    /// Its return address.
    caller: u64,
    /// The entry hook's stamp and the thread's hook ticks then.
    t0: u64,
    h0: u64,
    /// Program ticks of its direct callees.
    child: u64,
    /// No other activation of the function was open when it began.
    outermost: bool,
}

/// One function's numbers on one thread.
#[derive(Clone, Default)]
struct FnAgg {
    calls: u64,
    timed: u64,
    inclusive: u64,
    self_ticks: u64,
    min: u64,
    max: u64,
    hist: FineHist,
    /// The calls' own time summed, and the hooks' charges inside them
    /// (every callee's hooks: `profile::range`).
    own: u64,
    hooks_in: u64,
    /// Calls closed at thread or process exit.
    open_at_exit: u64,
}

/// A thread's state: its open calls and its numbers, behind one lock that
/// only the report takes besides the thread.
#[derive(Default)]
struct State {
    frames: Vec<Frame>,
    /// Open activations per function (outermost detection).
    active: Vec<u32>,
    funcs: Vec<FnAgg>,
    /// (caller function or `u32::MAX` for none, callee) -> (calls, ticks).
    edges: HashMap<(u32, u32), (u64, u64)>,
    unmatched: u64,
    abandoned: u64,
    too_deep: u64,
    /// Its thread's kernel id.
    tid: i32,
}

struct Thread {
    tid: i32,
    state: Mutex<State>,
}

/// The tracer.
pub(crate) struct Tracer {
    funcs: Segmented<Func, 1024>,
    by_addr: Mutex<HashMap<usize, u32>>,
    threads: Mutex<Vec<Arc<Thread>>>,
    inlined: bool,
    inlined_off: AtomicU64,
    no_cfa: AtomicU64,
    start: Mutex<(u64, Instant)>,
    out: PathBuf,
    program: String,
    /// The calls kept for the timeline.
    timeline: crate::timeline::Log,
}

static TRACER: OnceLock<Tracer> = OnceLock::new();

fn get() -> Option<&'static Tracer> {
    TRACER.get()
}

/// Whether the tracer was made (it is made once a process).
pub(crate) fn installed() -> bool {
    TRACER.get().is_some()
}

/// Starts the tracer: hooks time themselves, every probe goes on. Refused
/// if it was made before (an attach after a detach).
pub(crate) fn install(out: &Path, inlined: bool) -> crate::Result<()> {
    let fresh = TRACER.set(Tracer {
        funcs: Segmented::new(),
        by_addr: Mutex::new(HashMap::new()),
        threads: Mutex::new(Vec::new()),
        inlined,
        inlined_off: AtomicU64::new(0),
        no_cfa: AtomicU64::new(0),
        start: Mutex::new((tsc::now(), Instant::now())),
        out: out.to_path_buf(),
        program: std::env::args().next().unwrap_or_default(),
        timeline: crate::timeline::Log::from_env(crate::timeline::DEFAULT_CALLS),
    });
    if fresh.is_err() {
        return Err(crate::Error::InvalidArgument(
            "the trace tool runs once in a process: its tables are not made again".into(),
        ));
    }
    crate::hookcost::start_clock();
    // Every exit is traced.
    crate::clock::set_cheap_exits(false);
    crate::api::listen(discovered)
}

/// The tracer's discovery (`crate::api::listen` hands it each probe while
/// it traces).
fn discovered(m: &ProbeMeta) {
    let Some(t) = get() else { return };
    // Points are no function's: they stay off (as they start).
    if !crate::filter::admit(m) || m.kind == crate::probe::ProbeKind::Point {
        return;
    }
    if !t.inlined && m.inlined {
        if crate::deactivate(m.id).is_ok() {
            t.inlined_off.fetch_add(1, Ordering::Relaxed);
        }
        return;
    }
    let fi = {
        let mut map = t.by_addr.lock();
        match map.get(&m.function) {
            Some(&fi) => fi,
            None => {
                let Some(fi) = t.funcs.push(Func {
                    addr: m.function,
                    name: m.name(),
                }) else {
                    crate::log::warn(format_args!("trace: function table full; {} not traced", m.name()));
                    return;
                };
                map.insert(m.function, fi);
                fi
            }
        }
    };
    if let Some(p) = registry::get(m.id) {
        p.tool.store(fi as u64 + 1, Ordering::Relaxed);
    }
    let h: crate::Handler = if m.kind == ProbeKind::Entry { on_entry } else { on_exit };
    if let Err(e) = crate::activate(m.id, h) {
        crate::log::warn(format_args!("trace: probe {}: {e}", m.id));
    }
}

fn func_of(id: ProbeId) -> Option<u32> {
    Some(registry::get(id)?.tool.load(Ordering::Relaxed).checked_sub(1)? as u32)
}

struct Local(Arc<Thread>);

impl Drop for Local {
    fn drop(&mut self) {
        crate::arch::tls::set_profile_store(0);
        // Calls still open when the thread ends (its body, a call left by
        // `pthread_exit`) end now.
        let now = tsc::now();
        let h = clock::current().map_or(0, |c| c.hook_ticks());
        close_open(&mut self.0.state.lock(), now, h);
    }
}

thread_local! {
    static LOCAL: Local = Local(new_thread());
}

fn new_thread() -> Arc<Thread> {
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    let t = Arc::new(Thread {
        tid,
        state: Mutex::new(State {
            tid,
            ..State::default()
        }),
    });
    if let Some(tr) = get() {
        tr.threads.lock().push(t.clone());
    }
    t
}

/// Runs `f` on this thread's state; `None` while the thread exits. The
/// tool-store TLS slot is the profiler's too: one tool runs per process.
#[inline(always)]
fn with_state<R>(f: impl FnOnce(&mut State) -> R) -> Option<R> {
    let p = crate::arch::tls::profile_store() as *const Thread;
    if !p.is_null() {
        // SAFETY: a non-zero word points at this thread's record, which its
        // `Local` keeps alive until it clears the word.
        return Some(f(&mut unsafe { &*p }.state.lock()));
    }
    LOCAL
        .try_with(|l| {
            crate::arch::tls::set_profile_store(Arc::as_ptr(&l.0) as u64);
            f(&mut l.0.state.lock())
        })
        .ok()
}

impl State {
    fn agg(&mut self, fi: u32) -> &mut FnAgg {
        let i = fi as usize;
        if self.funcs.len() <= i {
            self.funcs.resize(i + 1, FnAgg::default());
            self.active.resize(i + 1, 0);
        }
        &mut self.funcs[i]
    }

    /// Closes frame `fr` at `t1` (hook ticks then `h1`).
    fn close(&mut self, fr: Frame, t1: u64, h1: u64, at_exit: bool) {
        let d = clock::program_ticks(fr.t0, fr.h0, t1, h1);
        if let Some(a) = self.active.get_mut(fr.func as usize) {
            *a = a.saturating_sub(1);
        }
        let parent = self.frames.last_mut().map(|p| {
            p.child += d;
            (p.func, p.outermost)
        });
        let a = self.agg(fr.func);
        a.timed += 1;
        if a.timed == 1 || d < a.min {
            a.min = d;
        }
        a.max = a.max.max(d);
        a.hist.add(d);
        a.own = a.own.saturating_add(d);
        a.hooks_in = a.hooks_in.saturating_add(t1.saturating_sub(fr.t0).saturating_sub(d));
        a.self_ticks += d.saturating_sub(fr.child);
        if fr.outermost {
            a.inclusive += d;
        }
        if at_exit {
            a.open_at_exit += 1;
        }
        if let Some(t) = get() {
            // Its depth: the frames still open below it, plus itself.
            let depth = u32::try_from(self.frames.len() + 1).unwrap_or(u32::MAX);
            t.timeline.push(crate::timeline::Call {
                tid: self.tid,
                func: fr.func,
                start: fr.t0,
                end: t1,
                own: d,
                weight: 1,
                depth,
            });
        }
        let (pf, pouter) = parent.unwrap_or((u32::MAX, false));
        let e = self.edges.entry((pf, fr.func)).or_default();
        e.0 += 1;
        if pouter || pf == u32::MAX {
            e.1 += d;
        }
    }

    /// Drops the frames that cannot be live under a hook of the frame at
    /// `cfa` whose return address is `caller` (left by `longjmp`, an
    /// exception, an exit not seen), as the profiler does: a lower CFA, or
    /// the same CFA with another return address, unless the provider gives
    /// exact CFAs (`exact`, sleds) and the frame there tail-called this
    /// one, which names it as its caller. Entering `entering`, a frame of
    /// the same function at the same CFA and return address is dead too.
    fn pop_dead(&mut self, cfa: u64, caller: u64, exact: bool, entering: Option<u32>) {
        let tail_called_from = |f: &Frame| {
            exact
                && registry::get(f.entry)
                    .is_some_and(|e| (e.meta.site + providers::patchable::SLED_LEN) as u64 == caller)
        };
        while let Some(top) = self.frames.last() {
            let live_here = top.cfa == cfa
                && (top.caller == caller || tail_called_from(top))
                && !(entering == Some(top.func) && top.caller == caller);
            if top.cfa > cfa || live_here {
                break;
            }
            let fr = self.frames.pop().expect("checked");
            if let Some(a) = self.active.get_mut(fr.func as usize) {
                *a = a.saturating_sub(1);
            }
            self.abandoned += 1;
        }
    }
}

/// Closes every frame still open on a thread at `now` (hook ticks `h`).
fn close_open(st: &mut State, now: u64, h: u64) {
    while let Some(fr) = st.frames.pop() {
        st.close(fr, now, h, true);
    }
}

extern "C" fn on_entry(id: ProbeId) {
    let Some(fi) = func_of(id) else { return };
    let ctx = hooks::context();
    let Some(cfa) = hooks::cfa(ctx) else {
        if let Some(t) = get() {
            t.no_cfa.fetch_add(1, Ordering::Relaxed);
        }
        return;
    };
    let h0 = clock::current().map_or(0, |c| c.hook_ticks());
    with_state(|st| {
        st.agg(fi).calls += 1;
        st.pop_dead(cfa, ctx.call_site as u64, ctx.cfa != 0, Some(fi));
        if st.frames.len() >= MAX_DEPTH {
            st.too_deep += 1;
            return;
        }
        let outermost = st.active[fi as usize] == 0;
        st.active[fi as usize] += 1;
        st.frames.push(Frame {
            func: fi,
            entry: id,
            cfa,
            caller: ctx.call_site as u64,
            t0: ctx.started,
            h0,
            child: 0,
            outermost,
        });
    });
}

extern "C" fn on_exit(id: ProbeId) {
    let Some(fi) = func_of(id) else { return };
    let ctx = hooks::context();
    let Some(cfa) = hooks::cfa(ctx) else {
        if let Some(t) = get() {
            t.no_cfa.fetch_add(1, Ordering::Relaxed);
        }
        return;
    };
    let h1 = clock::current().map_or(0, |c| c.hook_ticks());
    with_state(|st| {
        st.pop_dead(cfa, ctx.call_site as u64, ctx.cfa != 0, None);
        match st.frames.last() {
            Some(top) if top.cfa == cfa && top.func == fi => {
                let fr = st.frames.pop().expect("checked");
                st.close(fr, ctx.started, h1, false);
            }
            _ => st.unmatched += 1,
        }
    });
}

/// Resets after fork: the child traces its own calls, and only this
/// thread exists.
pub(crate) fn fork_child() {
    let Some(t) = get() else { return };
    // SAFETY: the parent's fork handlers took no tracer lock; a lock held
    // by a thread that does not exist in the child is released here.
    unsafe {
        if t.threads.is_locked() {
            t.threads.force_unlock();
        }
    }
    let me = LOCAL.try_with(|l| l.0.clone()).ok();
    let mut threads = t.threads.lock();
    threads.retain(|x| me.as_ref().is_some_and(|m| Arc::ptr_eq(m, x)));
    for th in threads.iter() {
        // SAFETY: as above.
        unsafe {
            if th.state.is_locked() {
                th.state.force_unlock();
            }
        }
        let mut st = th.state.lock();
        let frames = std::mem::take(&mut st.frames);
        let active = std::mem::take(&mut st.active);
        *st = State {
            frames,
            active,
            // SAFETY: gettid has no preconditions.
            tid: unsafe { libc::gettid() },
            ..State::default()
        };
    }
    t.timeline.clear();
    *t.start.lock() = (tsc::now(), Instant::now());
}

/// Writes `fastinst-trace.<pid>.{txt,json,pb.gz,timeline.json.gz}` under the output
/// directory and says where; calls still open are closed now.
pub(crate) fn write_reports() {
    let Some(t) = get() else { return };
    if registry::count() == 0 {
        return;
    }
    let now = tsc::now();
    let r = collect(t, now);
    let written = crate::profile::report::write_named(&r, &t.out, "fastinst-trace").and_then(|mut w| {
        if let Some(path) = write_timeline(t, &r)? {
            w.files.push(path);
        }
        Ok(w)
    });
    crate::profile::report::announce(&format!("trace of {} functions", r.functions.len()), &t.out, written);
}

/// Writes the timeline of the calls kept (the report `r` has just closed
/// the open ones); `None` when it keeps none.
fn write_timeline(t: &Tracer, r: &Report) -> std::io::Result<Option<PathBuf>> {
    let tracks = t.timeline.tracks();
    if tracks.is_empty() {
        return Ok(None);
    }
    let names = (0..t.funcs.len())
        .map(|fi| match t.funcs.get(fi) {
            Some(f) if !f.name.is_empty() => f.name.to_string(),
            Some(f) => format!("[{:#x}]", f.addr),
            None => "[unknown]".to_string(),
        })
        .collect();
    let tl = Timeline {
        tool: "fastinst trace".into(),
        pid: r.pid,
        names,
        tracks,
        origin: t.start.lock().0,
        ticks_per_us: r.tsc_mhz,
        dropped: t.timeline.dropped(),
        filtered: t.timeline.filtered(),
    };
    let path = t.out.join(format!("fastinst-trace.{}.timeline.json.gz", r.pid));
    fastinst_report::timeline::write_file(&tl, &path)?;
    Ok(Some(path))
}

fn collect(t: &Tracer, now: u64) -> Report {
    let (t0, i0) = *t.start.lock();
    let wall_ns = i0.elapsed().as_nanos().max(1) as f64;
    let ticks_per_ns = now.saturating_sub(t0) as f64 / wall_ns;
    let ms = |ticks: f64| ticks / ticks_per_ns / 1e6;
    let us = |ticks: f64| ticks / ticks_per_ns / 1e3;
    let nf = t.funcs.len() as usize;
    let mut total = vec![FnAgg::default(); nf];
    let mut tids: Vec<Vec<i32>> = vec![Vec::new(); nf];
    let mut edges: HashMap<(u32, u32), (u64, u64)> = HashMap::new();
    let (mut unmatched, mut abandoned, mut too_deep) = (0, 0, 0);
    for th in t.threads.lock().iter() {
        let mut st = th.state.lock();
        // Calls still open end now: this thread's at its own hook count,
        // another (still running) thread's at its count as last published.
        let h = clock::threads()
            .find(|c| c.tid() == th.tid)
            .map_or(0, |c| c.hook_ticks());
        close_open(&mut st, now, h);
        for (fi, a) in st.funcs.iter().enumerate() {
            if a.calls == 0 && a.timed == 0 {
                continue;
            }
            let tot = &mut total[fi];
            if tot.timed == 0 || (a.timed > 0 && a.min < tot.min) {
                tot.min = a.min;
            }
            tot.calls += a.calls;
            tot.timed += a.timed;
            tot.inclusive += a.inclusive;
            tot.self_ticks += a.self_ticks;
            tot.own = tot.own.saturating_add(a.own);
            tot.hooks_in = tot.hooks_in.saturating_add(a.hooks_in);
            tot.max = tot.max.max(a.max);
            tot.hist.merge(&a.hist);
            tot.open_at_exit += a.open_at_exit;
            tids[fi].push(th.tid);
        }
        for (k, v) in &st.edges {
            let e = edges.entry(*k).or_default();
            e.0 += v.0;
            e.1 += v.1;
        }
        unmatched += st.unmatched;
        abandoned += st.abandoned;
        too_deep += st.too_deep;
    }
    let name = |fi: u32| match t.funcs.get(fi) {
        Some(f) if !f.name.is_empty() => f.name.to_string(),
        Some(f) => format!("[{:#x}]", f.addr),
        None => "[root]".to_string(),
    };
    let mut functions: Vec<FunctionRow> = total
        .iter()
        .enumerate()
        .filter(|(_, a)| a.calls > 0 || a.timed > 0)
        .map(|(fi, a)| {
            let f = t.funcs.get(fi as u32).expect("exists");
            let q = |p: f64| us(a.hist.percentile(a.timed, p).clamp(a.min as f64, a.max as f64));
            // Every call timed: a percentile is known to its bucket and
            // the hooks' charges inside the calls.
            let sys = crate::profile::range::systematic(a.hooks_in as f64, a.own as f64);
            let exact = |p: f64| {
                (a.timed > 0).then(|| {
                    let mid = a.hist.percentile(a.timed, p);
                    let r = crate::profile::range::exact_range(
                        mid,
                        FineHist::HALF_BUCKET,
                        sys,
                        (a.min as f64, a.max as f64),
                    );
                    Range {
                        lo: us(r.lo),
                        hi: r.hi.map(us),
                    }
                })
            };
            FunctionRow {
                name: name(fi as u32),
                address: format!("{:#x}", f.addr),
                calls_sampled: a.timed,
                calls_estimated: a.calls as f64,
                calls_sd: 0.0,
                calls_exact: true,
                total_ms: ms(a.inclusive as f64),
                // Every call timed: only the hooks' charges inside the
                // calls leave the total uncertain, as its percentiles.
                total_sd: ms(a.inclusive as f64)
                    * crate::profile::range::charges_error(a.hooks_in as f64, a.own as f64),
                recursive: false,
                total_capped: false,
                self_ms: ms(a.self_ticks as f64),
                cpu_samples: 0,
                self_share: None,
                self_sd_ms: 0.0,
                mean_us: us(a.hist.iter().map(|(m, c)| m * c as f64).sum::<f64>() / a.timed.max(1) as f64),
                min_us: us(a.min as f64),
                p50_us: q(0.5),
                p90_us: q(0.9),
                p99_us: q(0.99),
                p50_range: exact(0.5),
                p90_range: exact(0.9),
                p99_range: exact(0.99),
                calls_effective: a.timed as f64,
                max_us: us(a.max as f64),
                threads: {
                    let mut v = tids[fi].clone();
                    v.sort_unstable();
                    v
                },
            }
        })
        .collect();
    functions.sort_by(|a, b| b.total_ms.total_cmp(&a.total_ms).then(a.name.cmp(&b.name)));
    let mut edges_out: Vec<EdgeRow> = edges
        .iter()
        .map(|(&(caller, callee), &(calls, ticks))| EdgeRow {
            caller: if caller == u32::MAX {
                "[root]".into()
            } else {
                name(caller)
            },
            callee: name(callee),
            calls_sampled: calls,
            calls_estimated: calls as f64,
            total_ms: ms(ticks as f64),
        })
        .collect();
    edges_out.sort_by(|a, b| b.total_ms.total_cmp(&a.total_ms).then(a.caller.cmp(&b.caller)));
    let calls: u64 = total.iter().map(|a| a.calls).sum();
    let wall_s = wall_ns / 1e9;
    let hook_ticks: u64 = clock::threads().map(|c| c.hook_ticks()).sum();
    Report {
        // Attached, calls in flight at the start were never entered.
        began_running: crate::attached::get(),
        schema: crate::profile::report::SCHEMA.into(),
        program: t.program.clone(),
        pid: std::process::id(),
        wall_ms: wall_ns / 1e6,
        tsc_mhz: ticks_per_ns * 1e3,
        settings: SettingsOut {
            samples_per_window: 0,
            epoch_ms: 0.0,
            inlined: t.inlined,
            windows: 0,
            density: 0,
            share: 0,
            cpu_samples: false,
            drawn: false,
            changed: 0,
            timing_scale: 1.0,
        },
        overhead: Overhead {
            probes: registry::count(),
            functions: t.funcs.len(),
            samples: calls,
            samples_per_s: calls as f64 / wall_s,
            toggles: 0,
            toggles_per_s: 0.0,
            handler_ms: ms(hook_ticks as f64),
            sampler_ms: 0.0,
            unmatched_exits: unmatched,
            abandoned_frames: abandoned,
            censored_frames: 0,
            too_deep,
            no_cfa: t.no_cfa.load(Ordering::Relaxed),
            no_thread: 0,
            stacks_merged: 0,
            inlined_copies_off: t.inlined_off.load(Ordering::Relaxed),
            filtered_off: crate::filter::refused(),
            open_at_exit: 0,
            windows_planned: 0,
            windows_opened: 0,
            windows_void: 0,
            sampler_wakeups: 0,
            cpu_wait_share: crate::contention::wait_share(),
        },
        functions,
        edges: edges_out,
        stacks: Stacks::default(),
        cpu: None,
    }
}
