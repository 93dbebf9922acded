//! The report of this run: what the profiler's threads, functions and CPU
//! samples say, collected into a [`Report`] (the model and its renderings
//! are the `fastinst-report` crate's, re-exported here).

pub use fastinst_report::*;

use super::paths::{CALLER_TAG, GAP};
use super::profiler::Profiler;
use super::survival::Adjusted;
use super::thread::{FnAgg, FxMap};
use fastinst_report::pathtree::PathTree;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Says on stderr, in one line, where `what` was written, or why it was
/// not; a flame graph that could not be drawn is logged as an error.
pub(crate) fn announce(what: &str, dir: &std::path::Path, written: std::io::Result<Written>) {
    if let Ok(w) = &written {
        // For the control socket's answer (`report`, `detach`).
        crate::attached::record_written(&w.files);
        // An attached runtime keeps out of the program's stderr: the
        // `fastinst attach` command that asked says where the files are.
        if crate::attached::get() {
            return;
        }
    }
    match written {
        Ok(w) => {
            if let Some(e) = &w.flame_error {
                crate::log::error(format_args!("no flame graph: {e}"));
            }
            // One line, made whole first: stderr is unbuffered, and
            // `eprintln!` writes each piece with a system call of its own,
            // between which the program's own output could fall.
            let line = format!(
                "fastinst: {what} written to {} (also {})\n",
                w.files[0].display(),
                w.files[1..]
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
        }
        Err(e) => crate::log::error(format_args!("cannot write the {what} to {}: {e}", dir.display())),
    }
}

/// The standard deviation, in ticks, of an inclusive time estimated as
/// `calls` (standard deviation `calls_sd`) times the weighted mean of
/// `a`'s timed outermost activations. The two are independent, so their
/// relative variances add. The mean's spread is the timed durations' over
/// the square root of their effective number (weights that differ say
/// less than as many equal ones: `(sum w)^2 / sum w^2`), less the share of
/// `calls` that was timed (none is left to estimate when all were); a
/// recursive function's outermost durations are taken to spread as its
/// durations do.
fn total_spread(a: &FnAgg, calls: f64, calls_sd: f64) -> f64 {
    if a.n == 0 || a.w == 0 || calls <= 0.0 {
        return 0.0;
    }
    let w = a.w as f64;
    let mean = a.sum as f64 / w;
    let outer_mean = a.outer_sum as f64 / w;
    let n_eff = w * w / (a.w2 as f64).max(1.0);
    let unsampled = (1.0 - a.n as f64 / calls).max(0.0);
    let mean_var = if a.n > 1 && n_eff > 1.0 {
        let var = a.hist.squares_about(mean) / w * n_eff / (n_eff - 1.0);
        var / n_eff * unsampled
    } else {
        // One timed call says nothing of the spread: as uncertain as it is long.
        mean * mean * unsampled
    };
    let rel = (calls_sd / calls).powi(2) + mean_var / (mean * mean).max(f64::MIN_POSITIVE);
    calls * outer_mean * rel.sqrt()
}

/// The part of a total `total` that the hooks inside its timed calls `a`
/// leave uncertain (one deviation, in `total`'s unit): they were taken
/// off the durations at their charge, which errs alike in every call
/// (`super::range::charges_error`), so no number of timed calls shrinks
/// it. A short function whose calls run probed callees holds most.
fn hooks_error(total: f64, a: &FnAgg) -> f64 {
    total * super::range::charges_error(a.hooks_in as f64, a.sum as f64)
}

/// A function's inclusive time (ticks) from its timed calls `a`, given
/// `all`, its estimated calls times their mean (the censored calls
/// weighed in), and the part of it that censored outermost activations
/// make, known only as a lower bound and so as uncertain as it is large.
///
/// Each outermost activation counts once (a nested one's time is in its
/// outermost one's): `all` times the outermost activations' share of the
/// timed time, a censored outermost one's with them. Without that one, an
/// interpreter's loop whose main activation was censored read zero: every
/// other timed call of it was nested in that one. A function with only
/// censored calls is taken as `all`.
fn inclusive(a: &FnAgg, all: f64) -> (f64, f64) {
    if a.w == 0 {
        return (if a.censored.is_empty() { 0.0 } else { all }, 0.0);
    }
    let oc = a.outer_censored as f64;
    let timed = a.sum as f64 + oc;
    if timed <= 0.0 {
        return (0.0, 0.0);
    }
    (all * (a.outer_sum as f64 + oc) / timed, all * oc / timed)
}

/// A function's total and its deviation, `(total, sd)`, where every
/// timed call was nested in an activation of its own that was never timed
/// whole (a recursion's untimed top; an interpreter's main loop whose exit
/// and censoring time went unseen): the outermost time is not known, so
/// the total is its self time at least (the CPU samples saw it run) and
/// may be anything up to `cap`, the run on its threads. It read zero with
/// no spread, and capped its callees at zero. Others as they are.
fn outermost_unknown(a: &FnAgg, (total, sd): (f64, f64), self_ms: f64, cap: f64) -> (f64, f64) {
    if a.n > 0 && a.outer_sum == 0 && a.outer_censored == 0 {
        (total.max(self_ms.min(cap)), sd.max(cap))
    } else {
        (total, sd)
    }
}

/// Caps each function's inclusive time at its callers': a function all of
/// whose timed calls came from instrumented functions (other than itself)
/// ran inside them, so its total is at most the sum of theirs, each with
/// two of its standard deviations of room (none for a caller timed
/// whole, such as a thread body). The deviation is the one `sd` gives by
/// name (the total's, less the hooks' charges' part: a callee's hooks are
/// among its caller's, so the two totals err alike), else the total's.
/// An estimate past it is marked capped (`!`), as one past the run is:
/// the report's totals nest as the calls do.
fn nest(functions: &mut [FunctionRow], edges: &[EdgeRow], sd: &FxMap<String, f64>) {
    let room: FxMap<&str, f64> = functions
        .iter()
        .map(|f| {
            let sd = sd.get(&f.name).copied().unwrap_or(f.total_sd);
            (f.name.as_str(), f.total_ms + 2.0 * sd)
        })
        .collect();
    // Per callee: the callers' room summed, or None once a caller is not
    // an instrumented function.
    let mut cap: FxMap<&str, Option<f64>> = FxMap::default();
    for e in edges.iter().filter(|e| e.caller != e.callee) {
        let c = cap.entry(e.callee.as_str()).or_insert(Some(0.0));
        *c = c.and_then(|sum| Some(sum + room.get(e.caller.as_str())?));
    }
    let caps: Vec<Option<f64>> = functions
        .iter()
        .map(|f| cap.get(f.name.as_str()).copied().flatten())
        .collect();
    for (f, cap) in functions.iter_mut().zip(caps) {
        if let Some(cap) = cap.filter(|&c| f.total_ms > c) {
            f.total_ms = cap;
            f.total_sd = f.total_sd.min(cap);
            f.total_capped = true;
        }
    }
}

/// Gathers every thread's samples into a report.
pub(crate) fn collect(p: &Profiler) -> Report {
    let (t0, i0) = *p.start.lock();
    let t1 = wordpatch::tsc::now();
    let wall_ns = i0.elapsed().as_nanos().max(1) as f64;
    let ticks_per_ns = (t1.saturating_sub(t0)) as f64 / wall_ns;
    let ms = |ticks: f64| ticks / ticks_per_ns / 1e6;
    let us = |ticks: f64| ticks / ticks_per_ns / 1e3;
    let k = p.live.samples();

    let mut fns: BTreeMap<u32, (FnAgg, Vec<i32>)> = BTreeMap::new();
    // (caller site, callee) -> (timed calls, the calls they stand for, weighted ticks)
    let mut edges: FxMap<(u64, u32), (u64, u64, u64)> = FxMap::default();
    // Each thread's path trie (`paths.rs`), merged into one `PathTree`
    // (`pathtree.rs`) by name once the names are made.
    let mut trees = Vec::new();
    let mut stacks_merged = 0;
    for t in p.threads.lock().iter() {
        let mut a = t.agg.lock();
        a.fold();
        for (fi, fa) in a.sampled() {
            let e = fns.entry(fi).or_default();
            e.0.merge(fa);
            e.1.push(t.tid);
        }
        stacks_merged += a.stacks_merged;
        for edge in a.edges.iter() {
            let e = edges.entry((edge.from, edge.func)).or_default();
            e.0 += edge.calls;
            e.1 += edge.w;
            e.2 = e.2.saturating_add(edge.ticks);
        }
        // Copied, to name outside the thread's lock.
        trees.push(a.paths.snapshot());
    }

    // Function ranges, to name a return address by its instrumented caller.
    // A function whose body lies apart (`Func::body`) has both ranges.
    let mut ranges: Vec<(usize, usize, u32)> = (0..p.funcs.len())
        .filter_map(|i| Some((i, p.funcs.get(i)?)))
        .flat_map(|(i, f)| {
            let body = (f.body.0.load(Ordering::Relaxed), f.body.1.load(Ordering::Relaxed));
            [
                Some((f.addr, f.end.load(Ordering::Relaxed), i)),
                (body.1 != 0).then_some((body.0, body.1, i)),
            ]
        })
        .flatten()
        .collect();
    ranges.sort_unstable();
    let caller_fn = |ret: u64| instrumented_caller(&ranges, ret);
    // Each name is made once, numbered, and shared by every path it
    // appears on: a string per frame per path was a third of the time spent
    // here, and the numbers let the paths sort without comparing names.
    let mut names = Names {
        p,
        ranges: &ranges,
        names: Vec::new(),
        functions: vec![None; p.funcs.len() as usize],
        callers: FxMap::default(),
        tree: PathTree::default(),
    };
    names.push("[...]".into());
    // Every thread's paths in one tree, named once per node of its own.
    // (node, samples, self ticks, the path's last item: its function)
    let mut ends: Vec<(u32, u64, u64, u64)> = Vec::new();
    for nodes in &trees {
        // Per node of the thread's trie: its node here, its path's last item.
        let mut merged = vec![(fastinst_report::pathtree::ROOT, GAP); nodes.len()];
        for (i, &(parent, seg, n, self_ticks)) in nodes.iter().enumerate().skip(1) {
            debug_assert!((parent as usize) < i, "a parent is made before its children");
            let (mut node, mut last) = merged[parent as usize];
            for item in seg.items() {
                let id = names.id(item);
                node = names.tree.child(node, id);
                last = item;
            }
            merged[i] = (node, last);
            if n > 0 {
                ends.push((node, n, self_ticks, last));
            }
        }
    }
    drop(trees);

    // Every function's call estimate, sampled or not.
    let mut est: FxMap<u32, f64> = FxMap::default();
    let mut spread: FxMap<u32, (f64, bool)> = FxMap::default();
    let held = p.schedule.hold();
    for fi in 0..p.funcs.len() {
        let Some(f) = p.funcs.get(fi) else { continue };
        let (calls, sd, exact) = current_estimate(p, &held, f, fi);
        let sampled = fns.get(&fi).map_or(0, |x| x.0.n);
        if calls > 0.0 || sampled > 0 {
            est.insert(fi, calls.max(sampled as f64));
            spread.insert(fi, (sd, exact));
        }
    }
    let timing_scale = held.budget.mean();
    drop(held);
    // Durations with the censored calls weighed in (`survival`), and how
    // much that raises each function's mean.
    let adjusted: FxMap<u32, Adjusted> = fns
        .iter()
        .filter(|(_, (a, _))| !a.censored.is_empty())
        .map(|(fi, (a, _))| (*fi, Adjusted::new(&a.hist, &a.censored)))
        .collect();
    let mut mean: FxMap<u32, f64> = FxMap::default();
    let mut raised: FxMap<u32, f64> = FxMap::default();
    for (fi, (a, _)) in &fns {
        let timed = a.sum as f64 / a.w.max(1) as f64;
        let m = adjusted
            .get(fi)
            .map_or(timed, |adj| adj.mean(a.sum as f64, a.w as f64, a.censored_w() as f64));
        mean.insert(*fi, m);
        if timed > 0.0 && m != timed {
            raised.insert(*fi, m / timed);
        }
    }
    let raised_by = |fi: u32| raised.get(&fi).copied().unwrap_or(1.0);
    let total_of = |fi: u32| est.get(&fi).copied().unwrap_or(0.0) * mean.get(&fi).copied().unwrap_or(0.0);
    let inclusive_of = |fi: u32| match fns.get(&fi) {
        Some((a, _)) => inclusive(a, total_of(fi)),
        None => (0.0, 0.0),
    };
    let cpu = cpu_attribution(&ranges, &p.program, ticks_per_ns * 1e6);

    // Edges, merged by caller function.
    // (caller name, callee) -> (timed calls, the calls they stand for,
    // weighted ticks, caller function).
    type EdgeRows = FxMap<(Arc<str>, u32), (u64, u64, u64, Option<u32>)>;
    let mut edge_rows = EdgeRows::default();
    for ((site, callee), (n, w, ticks)) in &edges {
        let cf = caller_fn(*site);
        let name = names.name(CALLER_TAG | *site);
        let e = edge_rows.entry((name, *callee)).or_insert((0, 0, 0, cf));
        e.0 += n;
        e.1 += w;
        e.2 = e.2.saturating_add(*ticks);
    }
    let mut child_time: FxMap<u32, f64> = FxMap::default();
    let mut edges_out = Vec::new();
    for ((caller, callee), (n, w, ticks, cf)) in edge_rows {
        let weight = fns.get(&callee).map(|x| x.0.w).unwrap_or(0).max(1);
        let calls = est.get(&callee).copied().unwrap_or(0.0) * w as f64 / weight as f64;
        // The callee's censored calls are taken to come from its callers
        // as its timed ones do.
        let time = calls * ticks as f64 / w.max(1) as f64 * raised_by(callee);
        if let Some(cf) = cf {
            if cf != callee {
                *child_time.entry(cf).or_default() += time;
            }
        }
        edges_out.push(EdgeRow {
            caller: caller.to_string(),
            callee: fn_name(p, callee),
            calls_sampled: n,
            calls_estimated: calls,
            total_ms: ms(time),
        });
    }
    edges_out.sort_by(|a, b| b.total_ms.total_cmp(&a.total_ms).then(a.caller.cmp(&b.caller)));

    let threads_seen = p.stores().count().max(1) as f64;
    let cap = wall_ns / 1e6 * threads_seen;
    let empty = (FnAgg::default(), Vec::new());
    // Each function's deviation without the hooks' part, by name.
    let mut room: FxMap<String, f64> = FxMap::default();
    let mut functions: Vec<FunctionRow> = est
        .keys()
        .copied()
        .chain(cpu.by_function.keys().copied())
        .collect::<std::collections::BTreeSet<u32>>()
        .into_iter()
        .map(|fi| {
            let f = p.funcs.get(fi).expect("exists");
            let name = fn_name(p, fi);
            let (a, tids) = fns.get(&fi).unwrap_or(&empty);
            let mut tids = tids.clone();
            tids.sort_unstable();
            tids.dedup();
            let (inclusive_ticks, censored_part) = inclusive_of(fi);
            let mut total = ms(inclusive_ticks);
            // No more than the run on each thread it was seen on (the
            // report's threads column), nor than on every thread.
            let cap = (wall_ns / 1e6 * tids.len().max(1) as f64).min(cap);
            let capped = total > cap;
            if capped {
                total = cap;
            }
            let samples = cpu.by_function.get(&fi).copied().unwrap_or(0);
            let self_ms = if cpu.taken {
                samples as f64 * cpu.out.interval_us / 1e3
            } else {
                ms((total_of(fi) - child_time.get(&fi).copied().unwrap_or(0.0)).max(0.0))
            };
            let (sd, exact) = spread.get(&fi).copied().unwrap_or((0.0, false));
            let calls = est.get(&fi).copied().unwrap_or(0.0);
            // A capped total is as uncertain as all of it, and no more:
            // the uncapped estimate's spread (millions of ms for a
            // recursive interpreter loop) says nothing of the cap.
            let sampled = ms((total_spread(a, calls, sd) * raised_by(fi)).hypot(censored_part));
            let spread = sampled.hypot(hooks_error(total, a));
            let total_sd = if capped { spread.min(total) } else { spread };
            // Its callees' room below it leaves the hooks' part out: their
            // hooks are among its own, charged alike, so their totals move
            // with it (`nest`).
            let (_, room_sd) = outermost_unknown(a, (total, sampled.min(total_sd)), self_ms, cap);
            room.insert(name.clone(), room_sd);
            let (total, total_sd) = outermost_unknown(a, (total, total_sd), self_ms, cap);
            let pct = |q: f64| match adjusted.get(&fi) {
                // A censored call may outlast every timed one.
                Some(adj) => us(adj.percentile(q)),
                None if a.n == 0 => 0.0,
                None => us(a.hist.percentile(a.w, q).max(a.min as f64).min(a.max as f64)),
            };
            // The same quantile function at the levels bounding each
            // percentile's rank (`range`).
            let n_eff = super::range::effective(a.w, a.w2);
            let half = super::hist::Hist::<{ super::hist::PROFILE_BITS }>::HALF_BUCKET;
            let bounds = (a.min as f64, a.max as f64);
            let err = super::range::Error {
                n: n_eff,
                half_bucket: half,
                systematic: super::range::systematic(a.hooks_in as f64, a.sum as f64),
            };
            let range = |q: f64| match adjusted.get(&fi) {
                Some(adj) => super::range::range(q, err, |l| adj.percentile(l), (bounds.0, f64::MAX), us),
                None => super::range::range(q, err, |l| a.hist.percentile(a.w, l), bounds, us),
            };
            FunctionRow {
                name,
                address: format!("{:#x}", f.addr),
                calls_sampled: a.n,
                calls_estimated: calls,
                calls_sd: sd,
                calls_exact: exact,
                total_ms: total,
                total_sd,
                recursive: a.nested > 0,
                total_capped: capped,
                self_ms,
                cpu_samples: samples,
                self_share: cpu.taken.then(|| 100.0 * samples as f64 / cpu.program.max(1) as f64),
                self_sd_ms: if cpu.taken {
                    self_sd(samples, cpu.program, cpu.out.interval_us)
                } else {
                    0.0
                },
                mean_us: us(mean.get(&fi).copied().unwrap_or(0.0)),
                min_us: if a.n == 0 { 0.0 } else { us(a.min as f64) },
                // A bucket's midpoint can lie outside the sampled range.
                p50_us: pct(0.5),
                p90_us: pct(0.9),
                p99_us: pct(0.99),
                p50_range: range(0.5),
                p90_range: range(0.9),
                p99_range: range(0.99),
                calls_effective: n_eff,
                max_us: us(a.max as f64),
                threads: tids,
            }
        })
        .collect();
    nest(&mut functions, &edges_out, &room);
    functions.sort_by(|a, b| b.total_ms.total_cmp(&a.total_ms).then(a.name.cmp(&b.name)));

    for (node, n, self_ticks, last) in ends {
        // A sample's path ends at its function; anything else has no scale.
        let scale = match (last != GAP && last & CALLER_TAG == 0).then_some(last as u32) {
            Some(fi) => {
                let weight = fns.get(&fi).map(|x| x.0.w).unwrap_or(0).max(1);
                est.get(&fi).copied().unwrap_or(0.0) / weight as f64
            }
            None => 0.0,
        };
        names.tree.end(node, n, ms(self_ticks as f64 * scale));
    }
    let stack_rows = used_names(&names.names, names.tree.rows(&names.names));

    let c = |field: fn(&super::store::Counters) -> &std::sync::atomic::AtomicU64| p.total(field);
    let wall_s = wall_ns / 1e9;
    let samples = c(|c| &c.samples);
    let toggles = c(|c| &c.toggles);
    Report {
        // Attached, calls in flight at the start were never entered.
        began_running: crate::attached::get(),
        schema: SCHEMA.into(),
        program: p.program.clone(),
        pid: std::process::id(),
        wall_ms: wall_ns / 1e6,
        tsc_mhz: ticks_per_ns * 1e3,
        settings: SettingsOut {
            samples_per_window: k,
            epoch_ms: p.live.epoch().as_secs_f64() * 1e3,
            inlined: p.settings.inlined,
            windows: p.live.windows() as u32,
            density: p.live.density_setting(),
            share: p.live.share_setting(),
            changed: p.live.changes(),
            cpu_samples: p.settings.cpu_samples,
            drawn: true,
            timing_scale,
        },
        overhead: Overhead {
            probes: crate::registry::count(),
            functions: p.funcs.len(),
            samples,
            samples_per_s: samples as f64 / wall_s,
            toggles,
            toggles_per_s: toggles as f64 / wall_s,
            handler_ms: ms(crate::clock::threads()
                .map(|t| t.hook_ticks())
                .sum::<u64>()
                .saturating_sub(p.hook_ticks_before) as f64),
            sampler_ms: p.sampler_ns.load(Ordering::Relaxed) as f64 / 1e6,
            sampler_wakeups: p.counters.wakeups.load(Ordering::Relaxed),
            unmatched_exits: c(|c| &c.unmatched_exits),
            abandoned_frames: c(|c| &c.abandoned),
            censored_frames: c(|c| &c.censored),
            too_deep: c(|c| &c.too_deep),
            no_cfa: c(|c| &c.no_cfa),
            no_thread: c(|c| &c.no_thread),
            stacks_merged,
            inlined_copies_off: c(|c| &c.inlined_off),
            filtered_off: crate::filter::refused(),
            open_at_exit: c(|c| &c.open_at_exit),
            windows_planned: c(|c| &c.windows_planned),
            windows_opened: c(|c| &c.windows_opened),
            windows_void: c(|c| &c.windows_void),
            cpu_wait_share: crate::contention::wait_share(),
        },
        functions,
        edges: edges_out,
        stacks: stack_rows,
        cpu: cpu.taken.then_some(cpu.out),
    }
}

/// The standard deviation of a self time of `n` of the program's `of`
/// CPU samples taken every `interval_us` (ms): a binomial count's. The
/// samples are taken at fixed steps of CPU time, not at random, so for a
/// program that does not keep step with them this is what their scatter
/// is; one that does can read further off (docs/profiler.md).
fn self_sd(n: u64, of: u64, interval_us: f64) -> f64 {
    count_sd(n as f64, of.max(1) as f64) * interval_us / 1e3
}

/// The CPU samples, charged to functions.
struct Cpu {
    /// Whether any were taken.
    taken: bool,
    /// Samples per instrumented function.
    by_function: FxMap<u32, u64>,
    /// The program's samples (the profiler's left out).
    program: u64,
    out: CpuOut,
}

/// Charges each CPU sample to the instrumented function holding its
/// program counter (`ranges`), or else to its symbol ([`symbol_name`]); the
/// profiler's own samples (in a handler, in its library, or in a sled's
/// stub) apart.
fn cpu_attribution(ranges: &[(usize, usize, u32)], program_name: &str, ticks_per_ms: f64) -> Cpu {
    let (samples, taken) = super::cpusample::samples();
    let (lo, hi) = super::cpusample::own_library();
    let stubs = crate::sled::stubarea::stub_areas();
    let samples: Vec<(super::cpusample::Sample, bool)> = samples
        .into_iter()
        .map(|s| {
            let in_stub = || stubs.iter().any(|&(a, b)| (a..b).contains(&(s.pc as usize)));
            (s, s.in_hook || (lo..hi).contains(&s.pc) || in_stub())
        })
        .collect();
    let threads = super::uncharged::rows(&samples, ticks_per_ms);
    let mut by_function: FxMap<u32, u64> = FxMap::default();
    let mut other: FxMap<u64, u64> = FxMap::default();
    let mut by_symbol: FxMap<Arc<str>, u64> = FxMap::default();
    let (mut program, mut profiler) = (0u64, 0u64);
    for (s, in_profiler) in samples {
        let pc = s.pc;
        if in_profiler {
            profiler += 1;
            continue;
        }
        program += 1;
        if let Some(fi) = instrumented_at(ranges, pc) {
            *by_function.entry(fi).or_default() += 1;
            continue;
        }
        *other.entry(pc).or_default() += 1;
    }
    // A snapshot: naming reads symbol tables, which the discovery lock
    // need not wait for.
    let modules = crate::discovery::with_state(|st| st.modules.clone());
    for (pc, n) in other {
        *by_symbol.entry(symbol_name(&modules, pc, program_name)).or_default() += n;
    }
    let mut rows: Vec<CpuRow> = by_symbol
        .into_iter()
        .map(|(name, samples)| CpuRow {
            name: name.to_string(),
            samples,
            share: 100.0 * samples as f64 / program.max(1) as f64,
        })
        .collect();
    rows.sort_by(|a, b| b.samples.cmp(&a.samples).then(a.name.cmp(&b.name)));
    rows.truncate(100);
    let kept = program + profiler;
    let handler_lost = !super::cpusample::handler_kept();
    if handler_lost {
        crate::log::warn(format_args!(
            "profile: the program installed its own handler for the CPU samples' signal; no sample was kept after that"
        ));
    }
    Cpu {
        taken: taken > 0 || super::cpusample::mode() != super::cpusample::Mode::Off,
        by_function,
        program,
        out: CpuOut {
            interval_us: super::cpusample::interval_us(),
            samples: taken,
            profiler_samples: profiler,
            lost: taken.saturating_sub(kept),
            other: rows,
            threads,
            signal_us: super::signalcost::ticks() as f64 / (ticks_per_ms / 1e3),
            handler_lost,
        },
    }
}

/// The name of `pc`, outside instrumented functions: its symbol in the
/// loaded module holding it (the runtime's own module list, whose symbol
/// tables take a separate debug file's where it names more, as `perf
/// report` does), else the module's file name in brackets (`[vdso]` for
/// the kernel's, as perf calls it).
fn symbol_name(modules: &crate::modules::Modules, pc: u64, program: &str) -> Arc<str> {
    let Some(m) = modules.find(pc) else {
        return Arc::from("[unknown]");
    };
    // The whole table, not `Module::function`'s first few passes over the
    // file's own symbols: every sample is named from the same table.
    if let Some(f) = m.symbols().containing(pc) {
        return Arc::from(f.name.as_str());
    }
    if m.path.starts_with("linux-vdso") {
        return Arc::from("[vdso]");
    }
    let file = if m.path.is_empty() { program } else { m.path.as_str() };
    Arc::from(format!("[{}]", file.rsplit('/').next().unwrap_or(file)))
}

/// `f`'s call estimate now (function `fi`): what its folded epochs say,
/// and, for a function counted whole, its calls counted since (a report
/// while the program runs; at exit the last epoch is folded first).
fn current_estimate(p: &Profiler, s: &super::schedule::Inner, f: &super::functions::Func, fi: u32) -> (f64, f64, bool) {
    let windowed = f.window.kind() == super::window::Kind::Windowed;
    let live = if windowed { 0.0 } else { p.counted(fi) as f64 };
    // SAFETY: the caller holds the schedule's lock (`s`).
    unsafe { f.window.estimate_mut() }.calls(s.exposure.value(), windowed, live)
}

/// The instrumented function holding return address `ret`, by `ranges`
/// (start, end, function index; sorted). A return address may be its
/// function's end (a call as its last instruction).
fn instrumented_caller(ranges: &[(usize, usize, u32)], ret: u64) -> Option<u32> {
    let i = ranges.partition_point(|r| r.0 < ret as usize);
    let r = ranges.get(i.checked_sub(1)?)?;
    (r.1 != 0 && (ret as usize) <= r.1).then_some(r.2)
}

/// The instrumented function whose code holds `pc`, the next instruction
/// of an interrupted thread (a CPU sample's), by `ranges`. Unlike a return
/// address, a `pc` at a function's end is the next function's first
/// instruction: a sample that landed on a hot function's entry was once
/// charged to the function laid out before it, which was never called.
fn instrumented_at(ranges: &[(usize, usize, u32)], pc: u64) -> Option<u32> {
    let i = ranges.partition_point(|r| r.0 <= pc as usize);
    let r = ranges.get(i.checked_sub(1)?)?;
    ((pc as usize) < r.1).then_some(r.2)
}

/// The names of path items (see [`super::thread`]), numbered as they are
/// first met: a function, or a caller by return address (the instrumented
/// function holding it, else its symbol); 0 is `[...]`.
struct Names<'a> {
    p: &'a Profiler,
    ranges: &'a [(usize, usize, u32)],
    names: Vec<Arc<str>>,
    /// By function index.
    functions: Vec<Option<u32>>,
    /// By return address.
    callers: FxMap<u64, u32>,
    /// The paths, over these names.
    tree: PathTree,
}

impl Names<'_> {
    /// Numbers `name`.
    fn push(&mut self, name: Arc<str>) -> u32 {
        let id = self.names.len() as u32;
        self.tree.name(id, &name);
        self.names.push(name);
        id
    }

    fn function(&mut self, fi: u32) -> u32 {
        if let Some(Some(id)) = self.functions.get(fi as usize) {
            return *id;
        }
        let id = self.push(fn_name(self.p, fi).into());
        if let Some(slot) = self.functions.get_mut(fi as usize) {
            *slot = Some(id);
        }
        id
    }

    fn id(&mut self, item: u64) -> u32 {
        if item == GAP {
            return 0;
        }
        if item & CALLER_TAG == 0 {
            return self.function(item as u32);
        }
        let ret = item & !CALLER_TAG;
        if let Some(&id) = self.callers.get(&ret) {
            return id;
        }
        let id = match instrumented_caller(self.ranges, ret) {
            Some(fi) => self.function(fi),
            None => {
                let name = crate::discovery::with_state(|st| {
                    st.modules
                        .find(ret)
                        .and_then(|m| m.function(ret - 1))
                        .map(|f| providers::elf::demangle(&f.name))
                })
                .unwrap_or_else(|| format!("[{ret:#x}]"));
                self.push(name.into())
            }
        };
        self.callers.insert(ret, id);
        id
    }

    fn name(&mut self, item: u64) -> Arc<str> {
        let id = self.id(item);
        self.names[id as usize].clone()
    }
}

/// Function `fi`'s name as the report gives it.
pub(super) fn fn_name(p: &Profiler, fi: u32) -> String {
    match p.funcs.get(fi) {
        Some(f) if !f.name.is_empty() => f.name.to_string(),
        Some(f) => format!("[{:#x}]", f.addr),
        None => format!("[function {fi}]"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A self time's deviation is a binomial count's, against the exact
    /// quantiles of many draws: shares of 1%, 30% and 90% of 2,000
    /// samples, drawn 4,000 times each.
    #[test]
    fn a_self_times_deviation_is_its_counts_scatter() {
        let mut rng = testkit::Rng(0x9E37_79B9_7F4A_7C15);
        for p in [0.01, 0.3, 0.9] {
            let (of, draws) = (2_000u64, 4_000);
            let counts: Vec<f64> = (0..draws)
                .map(|_| (0..of).filter(|_| rng.unit() < p).count() as f64)
                .collect();
            let mean = counts.iter().sum::<f64>() / draws as f64;
            let var = counts.iter().map(|c| (c - mean).powi(2)).sum::<f64>() / (draws - 1) as f64;
            // One draw's stated deviation, in samples (interval 1 ms).
            let stated = self_sd((p * of as f64) as u64, of, 1_000.0);
            let ratio = stated / var.sqrt();
            assert!(
                (0.93..1.07).contains(&ratio),
                "share {p}: stated {stated}, scatter {}",
                var.sqrt()
            );
        }
        assert_eq!(self_sd(0, 1_000, 500.0), 0.0);
        assert_eq!(self_sd(1_000, 1_000, 500.0), 0.0, "all of it: no scatter");
    }

    /// Each outermost activation counts once; a censored outermost one
    /// counts too, as a part as uncertain as it is large; a censored
    /// nested one does not.
    #[test]
    fn a_censored_outermost_activation_holds_its_functions_inclusive_time() {
        let mut a = FnAgg::default();
        a.record(100, true, 2, 0);
        a.record(50, false, 2, 0);
        // 40 calls of mean 75: the outermost ones' share, as before.
        assert_eq!(inclusive(&a, 3_000.0), (2_000.0, 0.0));
        a.censor(1_000, 2, false);
        assert_eq!(inclusive(&a, 3_000.0), (2_000.0, 0.0), "a nested one adds nothing");
        // An interpreter's loop: its timed calls nested in its main one,
        // censored. It was 0.
        let mut b = FnAgg::default();
        for _ in 0..3 {
            b.record(10, false, 4, 0);
        }
        assert_eq!(inclusive(&b, 5_000.0), (0.0, 0.0));
        b.censor(1_000, 2, true);
        let (total, censored) = inclusive(&b, 5_000.0);
        assert!((total - 5_000.0 * 2_000.0 / 2_120.0).abs() < 1e-6, "{total}");
        assert_eq!(total, censored);
        // Censored calls alone.
        let mut c = FnAgg::default();
        c.censor(1_000, 1, true);
        assert_eq!(inclusive(&c, 700.0), (700.0, 0.0));
        assert_eq!(inclusive(&FnAgg::default(), 700.0), (0.0, 0.0));
    }

    /// A function whose timed calls were all nested in an untimed
    /// activation of its own has an unknown total: its self time at least,
    /// anything up to the run; one with an outermost call timed, or with
    /// no timed call, is left as it is.
    #[test]
    fn a_total_of_nested_calls_alone_is_unknown_up_to_the_run() {
        let mut nested = FnAgg::default();
        nested.record(10, false, 4, 0);
        assert_eq!(outermost_unknown(&nested, (0.0, 0.0), 92.5, 800.0), (92.5, 800.0));
        assert_eq!(outermost_unknown(&nested, (0.0, 0.0), 900.0, 800.0), (800.0, 800.0));
        let mut outer = nested.clone();
        outer.record(10, true, 4, 0);
        assert_eq!(outermost_unknown(&outer, (3.0, 1.0), 92.5, 800.0), (3.0, 1.0));
        nested.censor(1_000, 1, true);
        assert_eq!(outermost_unknown(&nested, (3.0, 1.0), 92.5, 800.0), (3.0, 1.0));
        assert_eq!(outermost_unknown(&FnAgg::default(), (0.0, 0.0), 5.0, 800.0), (0.0, 0.0));
    }

    /// Two functions laid end to end, and one whose end is not known: a
    /// CPU sample on the second's first byte is the second's, a return
    /// address there the first's (its last instruction a call).
    #[test]
    fn a_sample_on_a_functions_entry_is_that_functions() {
        let ranges = [(0x100, 0x200, 0), (0x200, 0x280, 1), (0x300, 0, 2)];
        assert_eq!(instrumented_at(&ranges, 0x200), Some(1));
        assert_eq!(instrumented_caller(&ranges, 0x200), Some(0));
        assert_eq!(instrumented_at(&ranges, 0x1ff), Some(0));
        assert_eq!(instrumented_at(&ranges, 0x100), Some(0));
        assert_eq!(instrumented_at(&ranges, 0xff), None);
        assert_eq!(instrumented_at(&ranges, 0x280), None);
        assert_eq!(instrumented_at(&ranges, 0x300), None);
        assert_eq!(instrumented_caller(&ranges, 0x300), None);
    }

    /// A callee's total is capped at its caller's, with room for the
    /// caller's sampling error but not for its hooks' charges, which its
    /// callee's total shares: a thread body timed whole leaves no room.
    #[test]
    fn a_callee_nests_in_its_caller_whatever_their_hooks_charges() {
        let row = |name: &str, total_ms: f64, total_sd: f64| FunctionRow {
            name: name.into(),
            total_ms,
            total_sd,
            ..FunctionRow::default()
        };
        let edge = |caller: &str, callee: &str| EdgeRow {
            caller: caller.into(),
            callee: callee.into(),
            calls_sampled: 1,
            calls_estimated: 1.0,
            total_ms: 1.0,
        };
        let edges = [edge("worker", "handle"), edge("handle", "lookup")];
        let rows = || {
            vec![
                row("worker", 100.0, 10.0),
                row("handle", 105.0, 5.0),
                row("lookup", 110.0, 1.0),
            ]
        };
        // Worker timed whole: its 10 ms deviation is its hooks' alone.
        let sd: FxMap<String, f64> = [("worker".to_string(), 0.0), ("handle".to_string(), 2.0)]
            .into_iter()
            .collect();
        let mut f = rows();
        nest(&mut f, &edges, &sd);
        assert_eq!(
            (f[1].total_ms, f[1].total_capped),
            (100.0, true),
            "handle within worker"
        );
        assert_eq!(f[1].total_sd, 5.0);
        // Lookup within handle's estimate, two of its sampling deviations
        // of room (the capped total's room is its own before the cap).
        assert_eq!((f[2].total_ms, f[2].total_capped), (109.0, true));
        assert!(!f[0].total_capped);
        // Without the split, the whole deviation is room.
        let mut f = rows();
        nest(&mut f, &edges, &FxMap::default());
        assert_eq!((f[1].total_ms, f[1].total_capped), (105.0, false));
    }

    /// A short function whose calls ran probed callees: its durations
    /// had their callees' hooks taken off at their charge, and the total
    /// is known only as well as that charge. A leaf's total has no such
    /// part.
    #[test]
    fn the_hooks_inside_timed_calls_leave_their_total_as_uncertain_as_their_charge() {
        let mut a = FnAgg::default();
        // Two calls standing for 4 each: 100 and 60 ticks of their own,
        // beside 300 and 180 ticks charged to hooks inside them.
        a.record(100, true, 4, 300);
        a.record(60, true, 4, 180);
        // Hooks three times the calls' own time.
        let want = 10.0 * 3.0 * super::super::window::HOOK_COST_SPREAD;
        assert!((hooks_error(10.0, &a) - want).abs() < 1e-9);
        let mut leaf = FnAgg::default();
        leaf.record(100, true, 4, 0);
        assert_eq!(hooks_error(10.0, &leaf), 0.0);
        assert_eq!(hooks_error(10.0, &FnAgg::default()), 0.0, "nothing timed");
    }

    /// The spread of an inclusive time is what the textbook formula gives
    /// from the exact durations (to within the histogram's buckets), and
    /// none is left when every call was timed.
    #[test]
    fn an_inclusive_times_spread_joins_the_calls_and_the_means() {
        let mut a = FnAgg::default();
        // A steady call, and a few preempted ones: a heavy tail.
        let mut d: Vec<u64> = vec![20_000; 1_000];
        d.extend([2_000_000, 900_000, 40_000, 45_000]);
        for &x in &d {
            a.record(x, true, 1, 0);
        }
        let n = d.len() as f64;
        let mean = d.iter().sum::<u64>() as f64 / n;
        let var = d.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / (n - 1.0);
        let (calls, calls_sd) = (64_000.0, 960.0);
        let want = calls * mean * ((calls_sd / calls).powi(2) + var / n * (1.0 - n / calls) / (mean * mean)).sqrt();
        let got = total_spread(&a, calls, calls_sd);
        assert!((got / want - 1.0).abs() < 0.05, "{got} vs {want}");
        // The tail dominates: a tenth of the total, where the call
        // estimate alone would say 1.5%.
        assert!(got > 0.08 * calls * mean, "{got}");
        assert_eq!(total_spread(&a, n, 0.0), 0.0, "every call timed");
        assert_eq!(total_spread(&FnAgg::default(), calls, calls_sd), 0.0);
    }

    /// Timed calls that stand for different numbers of calls: the mean is
    /// weighted, and its spread is the weighted estimator's (the
    /// linearised variance `sum w^2 (d - mean)^2 / (sum w)^2`), to within
    /// what the buckets and the effective-number shortcut allow when the
    /// weights do not depend on the durations.
    #[test]
    fn weighted_timed_calls_give_the_weighted_mean_and_its_spread() {
        let mut a = FnAgg::default();
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut samples = Vec::new();
        for i in 0..4_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let d = 1_000 + x % 50_000;
            let w = if i % 3 == 0 { 64 } else { 4 };
            a.record(d, true, w, 0);
            samples.push((d as f64, f64::from(w)));
        }
        let wsum: f64 = samples.iter().map(|s| s.1).sum();
        let mean = samples.iter().map(|s| s.0 * s.1).sum::<f64>() / wsum;
        assert!((a.sum as f64 / a.w as f64 - mean).abs() < 1e-6 * mean);
        let var = samples.iter().map(|s| s.1 * s.1 * (s.0 - mean).powi(2)).sum::<f64>() / (wsum * wsum);
        let calls = 1e9;
        let want = calls * mean * (var / (mean * mean)).sqrt();
        let got = total_spread(&a, calls, 0.0);
        assert!((got / want - 1.0).abs() < 0.1, "{got} vs {want}");
        // Equal weights would claim a smaller spread: the effective number
        // of timed calls is under the timed calls.
        let n_eff = wsum * wsum / samples.iter().map(|s| s.1 * s.1).sum::<f64>();
        assert!(n_eff < 0.6 * samples.len() as f64, "{n_eff}");
    }
}
