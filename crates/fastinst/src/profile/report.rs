//! The profile as people read it: a text table sorted by time, folded
//! stacks and a flame graph (inferno), and JSON (schema below).
//!
//! Estimates. Calls: per function, from its windows (`functions`).
//! Total time: mean sampled duration × estimated calls. Self time: total
//! minus the estimated time of its calls to other instrumented functions
//! (edges), never below 0; recursion counts an activation's time in every
//! enclosing activation of the same function, as gprof does. Edges: a
//! callee's sampled calls split by the function holding their return
//! address; estimated calls and time scale with the callee's estimate.
//! Flame graph: each sampled call's self time (its duration minus that of
//! its sampled direct children), scaled by its function's estimate ratio.
//! Paths are built from sampled frames only; `[...]` stands for frames that
//! were not sampled and the name beside it for the direct caller, so no
//! path shows a call that did not happen.
//!
//! JSON schema `fastinst-profile/2`: `{schema, program, pid, wall_ms,
//! tsc_mhz, settings: {samples_per_window, epoch_ms, inlined}, overhead:
//! {probes, functions, samples, samples_per_s, toggles, toggles_per_s,
//! handler_ms, sampler_ms, unmatched_exits, abandoned_frames, too_deep,
//! no_cfa, no_thread, stacks_merged, inlined_copies_off},
//! functions: [{name, address, calls_sampled, calls_estimated, total_ms,
//! self_ms, mean_us, min_us, p50_us, p90_us, p99_us, max_us, threads:
//! [tid]}], edges: [{caller, callee, calls_sampled, calls_estimated,
//! total_ms}], stacks: {names: [name], paths: [{frames: [index into
//! names], samples, self_ms}]}}` (paths ordered as their folded lines
//! sort: by their frames' names, outermost first); times in
//! milliseconds (`_ms`) or microseconds (`_us`), all estimated except the
//! sampled durations' order statistics.

use super::pathtree::{self, PathTree};
use super::thread::{FnAgg, FxMap, CALLER_TAG, GAP};
use super::Profiler;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The schema name and version this crate writes.
pub const SCHEMA: &str = "fastinst-profile/2";

/// The schemas this crate reads: version 1 spelled each stack's frames out
/// as names; version 2 lists the names once (`stacks.names`) and the
/// frames as indices into it (SQLite's report: 1.5 MB for ~6,900 paths,
/// where version 1 took 2.6 MB for ~6,300, written in about half the
/// time).
pub const SCHEMAS_READ: [&str; 2] = [SCHEMA, "fastinst-profile/1"];

/// The report's root.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Report {
    /// [`SCHEMA`] (or, read from an older file, one of [`SCHEMAS_READ`]).
    pub schema: String,
    /// `argv[0]`.
    pub program: String,
    /// Process id.
    pub pid: u32,
    /// Wall time profiled.
    pub wall_ms: f64,
    /// TSC ticks per microsecond.
    pub tsc_mhz: f64,
    /// Sampling settings.
    pub settings: SettingsOut,
    /// What the profiler cost and dropped.
    pub overhead: Overhead,
    /// Per function, by total time.
    pub functions: Vec<FunctionRow>,
    /// Caller -> callee, by time.
    pub edges: Vec<EdgeRow>,
    /// Sampled call paths.
    pub stacks: Stacks,
}

/// The sampled call paths, in the JSON's own form: each frame name once
/// ([`Stacks::names`]) and each path's frames as indices into them.
///
/// A path is a list of numbers, not of names: SQLite's report has ~4,200
/// paths of ~12 frames, and a name object per frame (a reference count
/// taken for each of ~50,000 frames, then every name found again by its
/// address to number it for the JSON) cost ~0.6 ms of its exit.
#[derive(Serialize, Debug, Clone, PartialEq, Default)]
pub struct Stacks {
    /// Frame names: functions, and `[...]` for frames not sampled.
    pub names: Vec<Arc<str>>,
    /// The paths, ordered as their folded lines sort (by their frames'
    /// names, outermost first).
    pub paths: Vec<StackRow>,
}

impl Stacks {
    /// The name of frame `i` (`?` for an index past the names, which
    /// reading a file rejects).
    pub fn name(&self, i: u32) -> &str {
        self.names.get(i as usize).map_or("?", |n| n)
    }

    /// `row`'s frame names, outermost first.
    pub fn frames<'a>(&'a self, row: &'a StackRow) -> impl Iterator<Item = &'a str> + 'a {
        row.frames.iter().map(move |&i| self.name(i))
    }

    /// Paths given by their frames' names (version 1's form, tests,
    /// reports built by hand), each name listed once, in order of first
    /// use. Not ordered or merged.
    pub fn from_named<N: AsRef<str>>(rows: impl IntoIterator<Item = (Vec<N>, u64, f64)>) -> Stacks {
        let mut ids: FxMap<Arc<str>, u32> = FxMap::default();
        let mut st = Stacks::default();
        for (frames, samples, self_ms) in rows {
            let frames = frames
                .iter()
                .map(|f| {
                    let f = f.as_ref();
                    if let Some(&i) = ids.get(f) {
                        return i;
                    }
                    let name: Arc<str> = Arc::from(f);
                    st.names.push(name.clone());
                    ids.insert(name, st.names.len() as u32 - 1);
                    st.names.len() as u32 - 1
                })
                .collect();
            st.paths.push(StackRow {
                frames,
                samples,
                self_ms,
            });
        }
        st
    }

    /// The number of paths.
    pub fn len(&self) -> usize {
        self.paths.len()
    }

    /// True if no path was sampled.
    pub fn is_empty(&self) -> bool {
        self.paths.is_empty()
    }
}

/// Reading [`Stacks`]: version 2's `{names, paths}`, checked, or version
/// 1's list of paths that spell their frames' names.
mod stacks_json {
    use super::{StackRow, Stacks};
    use serde::de::value::{MapAccessDeserializer, SeqAccessDeserializer};
    use serde::de::{MapAccess, SeqAccess, Visitor};
    use serde::{Deserialize, Deserializer};
    use std::sync::Arc;

    #[derive(Deserialize)]
    struct In {
        names: Vec<Arc<str>>,
        paths: Vec<StackRow>,
    }

    #[derive(Deserialize)]
    struct NamedRow {
        frames: Vec<String>,
        samples: u64,
        self_ms: f64,
    }

    /// Which form a file holds is decided by its shape (an object: version
    /// 2; a list: version 1), not by trying each in turn: serde's untagged
    /// enum buffered the whole field first and, on any error inside it,
    /// said only that the data "did not match any variant".
    struct Form;

    impl<'de> Visitor<'de> for Form {
        type Value = Stacks;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("stacks as {names, paths} or, in version 1, a list of {frames, samples, self_ms}")
        }

        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
            let t = In::deserialize(MapAccessDeserializer::new(map))?;
            let n = t.names.len();
            if t.paths.iter().any(|p| p.frames.iter().any(|&i| i as usize >= n)) {
                return Err(serde::de::Error::custom(format!(
                    "a stack's frame indexes past the {n} names"
                )));
            }
            Ok(Stacks {
                names: t.names,
                paths: t.paths,
            })
        }

        fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
            let rows = Vec::<NamedRow>::deserialize(SeqAccessDeserializer::new(seq))?;
            Ok(Stacks::from_named(
                rows.into_iter().map(|r| (r.frames, r.samples, r.self_ms)),
            ))
        }
    }

    impl<'de> Deserialize<'de> for Stacks {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Stacks, D::Error> {
            d.deserialize_any(Form)
        }
    }
}

/// Sampling settings as reported.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct SettingsOut {
    /// Samples per function per window.
    pub samples_per_window: u32,
    /// Epoch in ms.
    pub epoch_ms: f64,
    /// Whether copies of functions inlined into others were sampled
    /// (`FASTINST_PROFILE_INLINED`); false in reports written before the
    /// setting existed, which did sample them.
    #[serde(default)]
    pub inlined: bool,
}

/// The profiler's own cost and losses.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct Overhead {
    /// Probes discovered.
    pub probes: u32,
    /// Functions with probes.
    pub functions: u32,
    /// Sampled calls.
    pub samples: u64,
    /// Per second of wall time.
    pub samples_per_s: f64,
    /// Probe activations and deactivations by the profiler.
    pub toggles: u64,
    /// Per second of wall time.
    pub toggles_per_s: f64,
    /// Time spent in the profiler's handlers, all threads.
    pub handler_ms: f64,
    /// CPU time of the sampler thread (re-arming each epoch and waking up
    /// for it); 0 in reports written before it was recorded.
    #[serde(default)]
    pub sampler_ms: f64,
    /// Exits whose entry was not sampled (dropped).
    pub unmatched_exits: u64,
    /// Sampled activations left without an exit (longjmp, exceptions,
    /// thread exit; dropped).
    pub abandoned_frames: u64,
    /// Sampled calls deeper than the shadow stack (dropped).
    pub too_deep: u64,
    /// Hooks whose frame could not be found (dropped).
    pub no_cfa: u64,
    /// Hooks on a thread that was exiting (dropped).
    pub no_thread: u64,
    /// Samples whose call path was new after a thread's path table was
    /// full ([`super::MAX_PATH_NODES`]): kept as `[...];function`.
    #[serde(default)]
    pub stacks_merged: u64,
    /// Probes of inlined copies left off for the whole run (unless
    /// [`SettingsOut::inlined`]).
    #[serde(default)]
    pub inlined_copies_off: u64,
}

/// One function.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct FunctionRow {
    /// Demangled name, or the address.
    pub name: String,
    /// Entry address.
    pub address: String,
    /// Calls sampled (entry and exit seen).
    pub calls_sampled: u64,
    /// Estimated calls in all.
    pub calls_estimated: f64,
    /// Estimated total (inclusive) time.
    pub total_ms: f64,
    /// Estimated self time.
    pub self_ms: f64,
    /// Mean sampled duration.
    pub mean_us: f64,
    /// Sampled duration statistics.
    pub min_us: f64,
    /// Median.
    pub p50_us: f64,
    /// 90th percentile.
    pub p90_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// Maximum.
    pub max_us: f64,
    /// Threads (tids) it was sampled on.
    pub threads: Vec<i32>,
}

/// One caller -> callee edge.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct EdgeRow {
    /// The function holding the call's return address.
    pub caller: String,
    /// The instrumented callee.
    pub callee: String,
    /// Sampled calls along this edge.
    pub calls_sampled: u64,
    /// Estimated calls.
    pub calls_estimated: f64,
    /// Estimated time in the callee along this edge.
    pub total_ms: f64,
}

/// One sampled call path.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct StackRow {
    /// Outermost first, as indices into [`Stacks::names`] (whose `[...]`
    /// marks frames not sampled).
    pub frames: Vec<u32>,
    /// Sampled calls ending this path.
    pub samples: u64,
    /// Estimated self time of the last frame along this path.
    pub self_ms: f64,
}

/// Gathers every thread's samples into a report.
pub(crate) fn collect(p: &Profiler) -> Report {
    let (t0, i0) = *p.start.lock();
    let t1 = wordpatch::tsc::now();
    let wall_ns = i0.elapsed().as_nanos().max(1) as f64;
    let ticks_per_ns = (t1.saturating_sub(t0)) as f64 / wall_ns;
    let ms = |ticks: f64| ticks / ticks_per_ns / 1e6;
    let us = |ticks: f64| ticks / ticks_per_ns / 1e3;
    let k = p.settings.samples;

    let mut fns: BTreeMap<u32, (FnAgg, Vec<i32>)> = BTreeMap::new();
    let mut edges: FxMap<(u64, u32), (u64, u64)> = FxMap::default();
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
            e.1 += edge.ticks;
        }
        // Copied, to name outside the thread's lock.
        trees.push(a.paths.snapshot());
    }

    // Function ranges, to name a return address by its instrumented caller.
    let mut ranges: Vec<(usize, usize, u32)> = (0..p.funcs.len())
        .filter_map(|i| {
            let f = p.funcs.get(i)?;
            Some((f.addr, f.end.load(Ordering::Relaxed), i))
        })
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
        let mut merged = vec![(pathtree::ROOT, GAP); nodes.len()];
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

    let mut est: FxMap<u32, f64> = FxMap::default();
    let mut mean: FxMap<u32, f64> = FxMap::default();
    for (fi, (a, _)) in &fns {
        let f = p.funcs.get(*fi).expect("sampled function exists");
        est.insert(*fi, f.estimated_calls(k, t1).max(a.n as f64));
        mean.insert(*fi, a.sum as f64 / a.n.max(1) as f64);
    }
    let total_of = |fi: u32| est.get(&fi).copied().unwrap_or(0.0) * mean.get(&fi).copied().unwrap_or(0.0);

    // Edges, merged by caller function.
    // (caller name, callee) -> (sampled calls, ticks, caller function).
    type EdgeRows = FxMap<(Arc<str>, u32), (u64, u64, Option<u32>)>;
    let mut edge_rows = EdgeRows::default();
    for ((site, callee), (n, ticks)) in &edges {
        let cf = caller_fn(*site);
        let name = names.name(CALLER_TAG | *site);
        let e = edge_rows.entry((name, *callee)).or_insert((0, 0, cf));
        e.0 += n;
        e.1 += ticks;
    }
    let mut child_time: FxMap<u32, f64> = FxMap::default();
    let mut edges_out = Vec::new();
    for ((caller, callee), (n, ticks, cf)) in edge_rows {
        let sampled = fns.get(&callee).map(|x| x.0.n).unwrap_or(0).max(1);
        let calls = est.get(&callee).copied().unwrap_or(0.0) * n as f64 / sampled as f64;
        let time = calls * ticks as f64 / n.max(1) as f64;
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

    let mut functions: Vec<FunctionRow> = fns
        .iter()
        .map(|(fi, (a, tids))| {
            let f = p.funcs.get(*fi).expect("exists");
            let total = total_of(*fi);
            let mut tids = tids.clone();
            tids.sort_unstable();
            tids.dedup();
            FunctionRow {
                name: fn_name(p, *fi),
                address: format!("{:#x}", f.addr),
                calls_sampled: a.n,
                calls_estimated: est[fi],
                total_ms: ms(total),
                self_ms: ms((total - child_time.get(fi).copied().unwrap_or(0.0)).max(0.0)),
                mean_us: us(mean[fi]),
                min_us: us(a.min as f64),
                // A bucket's midpoint can lie outside the sampled range.
                p50_us: us(a.hist.percentile(a.n, 0.5).max(a.min as f64).min(a.max as f64)),
                p90_us: us(a.hist.percentile(a.n, 0.9).max(a.min as f64).min(a.max as f64)),
                p99_us: us(a.hist.percentile(a.n, 0.99).max(a.min as f64).min(a.max as f64)),
                max_us: us(a.max as f64),
                threads: tids,
            }
        })
        .collect();
    functions.sort_by(|a, b| b.total_ms.total_cmp(&a.total_ms).then(a.name.cmp(&b.name)));

    for (node, n, self_ticks, last) in ends {
        // A sample's path ends at its function; anything else has no scale.
        let scale = match (last != GAP && last & CALLER_TAG == 0).then_some(last as u32) {
            Some(fi) => {
                let sampled = fns.get(&fi).map(|x| x.0.n).unwrap_or(0).max(1);
                est.get(&fi).copied().unwrap_or(0.0) / sampled as f64
            }
            None => 0.0,
        };
        names.tree.end(node, n, ms(self_ticks as f64 * scale));
    }
    let stack_rows = used_names(&names.names, names.tree.rows(&names.names));

    let c = |field: fn(&super::Counters) -> &std::sync::atomic::AtomicU64| p.total(field);
    let wall_s = wall_ns / 1e9;
    let samples = c(|c| &c.samples);
    let toggles = c(|c| &c.toggles);
    Report {
        schema: SCHEMA.into(),
        program: p.program.clone(),
        pid: std::process::id(),
        wall_ms: wall_ns / 1e6,
        tsc_mhz: ticks_per_ns * 1e3,
        settings: SettingsOut {
            samples_per_window: k,
            epoch_ms: p.settings.epoch.as_secs_f64() * 1e3,
            inlined: p.settings.inlined,
        },
        overhead: Overhead {
            probes: crate::registry::count(),
            functions: p.funcs.len(),
            samples,
            samples_per_s: samples as f64 / wall_s,
            toggles,
            toggles_per_s: toggles as f64 / wall_s,
            handler_ms: ms(c(|c| &c.handler_ticks) as f64),
            sampler_ms: p.sampler_ns.load(Ordering::Relaxed) as f64 / 1e6,
            unmatched_exits: c(|c| &c.unmatched_exits),
            abandoned_frames: c(|c| &c.abandoned),
            too_deep: c(|c| &c.too_deep),
            no_cfa: c(|c| &c.no_cfa),
            no_thread: c(|c| &c.no_thread),
            stacks_merged,
            inlined_copies_off: c(|c| &c.inlined_off),
        },
        functions,
        edges: edges_out,
        stacks: stack_rows,
    }
}

/// The instrumented function holding return address `ret`, by `ranges`
/// (start, end, function index; sorted).
fn instrumented_caller(ranges: &[(usize, usize, u32)], ret: u64) -> Option<u32> {
    let i = ranges.partition_point(|r| r.0 < ret as usize);
    let r = ranges.get(i.checked_sub(1)?)?;
    (r.1 != 0 && (ret as usize) <= r.1).then_some(r.2)
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

fn fn_name(p: &Profiler, fi: u32) -> String {
    match p.funcs.get(fi) {
        Some(f) if !f.name.is_empty() => f.name.to_string(),
        Some(f) => format!("[{:#x}]", f.addr),
        None => format!("[function {fi}]"),
    }
}

/// The text report.
pub fn render_text(r: &Report) -> String {
    let mut s = String::new();
    let _ = text_to(r, &mut s);
    s
}

/// [`render_text`] into `s`.
fn text_to(r: &Report, s: &mut impl std::fmt::Write) -> std::fmt::Result {
    let o = &r.overhead;
    writeln!(
        s,
        "fastinst profile: {} (pid {}), {:.3} s profiled, TSC {:.0} MHz",
        r.program,
        r.pid,
        r.wall_ms / 1e3,
        r.tsc_mhz
    )?;
    writeln!(
        s,
        "sampling: {} calls per function per window, windows re-opened every {} ms",
        r.settings.samples_per_window, r.settings.epoch_ms
    )?;
    writeln!(
        s,
        "overhead: {} probes in {} functions; {} samples ({:.0}/s); {} toggles ({:.0}/s); {:.2} ms in handlers, {:.2} ms of sampler CPU",
        o.probes,
        o.functions,
        o.samples,
        o.samples_per_s,
        o.toggles,
        o.toggles_per_s,
        o.handler_ms,
        o.sampler_ms
    )?;
    writeln!(
        s,
        "dropped: {} exits whose entry was not sampled, {} activations left without exit, {} too deep, {} without frame, {} on exiting threads",
        o.unmatched_exits, o.abandoned_frames, o.too_deep, o.no_cfa, o.no_thread
    )?;
    if o.inlined_copies_off > 0 {
        writeln!(
            s,
            "inlined copies: {} probes in functions' copies inlined into other functions are off; their time is their callers' (FASTINST_PROFILE_INLINED=1 samples them)",
            o.inlined_copies_off
        )?;
    }
    if o.stacks_merged > 0 {
        writeln!(
            s,
            "call paths: {} samples past the table's {} distinct path prefixes per thread are shown as [...];function",
            o.stacks_merged,
            super::MAX_PATH_NODES
        )?;
    }
    writeln!(s)?;
    writeln!(
        s,
        "{:>12} {:>8} {:>10} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}  {:<8} function",
        "calls(est)",
        "sampled",
        "total ms",
        "self ms",
        "min us",
        "p50 us",
        "p90 us",
        "p99 us",
        "max us",
        "mean us",
        "threads"
    )?;
    // The rows are most of the text (SQLite: ~1,700 rows, ~15,000
    // numbers): each is built in one line buffer, numbers right-aligned
    // by hand, and written once, where `writeln!` with a width per field
    // went through the formatting machinery ~15 times a row.
    let mut line = Columns::default();
    for f in &r.functions {
        line.fixed(12, f.calls_estimated, 0);
        line.int(8, f.calls_sampled);
        line.fixed(10, f.total_ms, 3);
        line.fixed(10, f.self_ms, 3);
        for us in [f.min_us, f.p50_us, f.p90_us, f.p99_us, f.max_us, f.mean_us] {
            line.fixed(9, us, 2);
        }
        line.text.push(' ');
        line.int(0, f.threads.len() as u64);
        let pad = 8usize.saturating_sub(line.field.len());
        line.text.extend(std::iter::repeat_n(' ', pad));
        line.text.push(' ');
        line.text.push_str(&f.name);
        line.end(s)?;
    }
    writeln!(s)?;
    writeln!(s, "call edges (caller -> callee): calls(est), sampled, total ms")?;
    for e in &r.edges {
        line.fixed(12, e.calls_estimated, 0);
        line.int(8, e.calls_sampled);
        line.fixed(10, e.total_ms, 3);
        line.text.push_str("  ");
        line.text.push_str(&e.caller);
        line.text.push_str(" -> ");
        line.text.push_str(&e.callee);
        line.end(s)?;
    }
    Ok(())
}

/// A text report line of right-aligned columns, each after a space but
/// the first: what `{:>W}` of each field, separated by spaces, writes.
#[derive(Default)]
struct Columns {
    text: String,
    /// The field being written.
    field: String,
}

impl Columns {
    fn column(&mut self, width: usize) {
        if !self.text.is_empty() {
            self.text.push(' ');
        }
        // Digits, a point and a sign: one byte per character.
        let pad = width.saturating_sub(self.field.len());
        self.text.extend(std::iter::repeat_n(' ', pad));
        self.text.push_str(&self.field);
    }

    /// `{:>width$.places$}` of `x`.
    fn fixed(&mut self, width: usize, x: f64, places: u32) {
        self.field.clear();
        super::decimal::push_fixed(&mut self.field, x, places);
        self.column(width);
    }

    /// `{:>width$}` of `n`.
    fn int(&mut self, width: usize, n: u64) {
        self.field.clear();
        let _ = write!(self.field, "{n}");
        self.column(width);
    }

    /// Writes the line and a newline to `s`, and starts the next.
    fn end(&mut self, s: &mut impl std::fmt::Write) -> std::fmt::Result {
        self.text.push('\n');
        let r = s.write_str(&self.text);
        self.text.clear();
        r
    }
}

/// Folded stacks (`a;b;c weight`), weights in nanoseconds of self time.
pub fn render_folded(r: &Report) -> String {
    let mut s = String::new();
    let _ = folded_to(r, &mut s);
    s
}

/// [`render_folded`] into `out`, a line at a time; returns whether the
/// lines came out sorted, as inferno compares them (each line, without its
/// newline, at least the one before).
fn folded_to(r: &Report, out: &mut impl std::fmt::Write) -> Result<bool, std::fmt::Error> {
    let names = folded_names(&r.stacks);
    let (mut line, mut prev) = (String::new(), String::new());
    let mut sorted = true;
    for st in &r.stacks.paths {
        let w = folded_weight(st);
        if w == 0 {
            continue;
        }
        line.clear();
        for (i, &f) in st.frames.iter().enumerate() {
            if i > 0 {
                line.push(';');
            }
            line.push_str(names.get(f as usize).map_or("?", |n| n));
        }
        write!(line, " {w}")?;
        sorted &= prev <= line;
        out.write_str(&line)?;
        out.write_char('\n')?;
        std::mem::swap(&mut line, &mut prev);
    }
    Ok(sorted)
}

/// Each of `st`'s names as the folded stacks write it ([`folded_name`]),
/// copied only where it differs.
pub(super) fn folded_names(st: &Stacks) -> Vec<std::borrow::Cow<'_, str>> {
    st.names
        .iter()
        .map(|n| {
            if n.bytes().any(|b| b == b';' || b == b' ') {
                // ASCII bytes replaced by an ASCII byte: still UTF-8.
                String::from_utf8(folded_name(n).collect())
                    .expect("separators replaced by `_`")
                    .into()
            } else {
                std::borrow::Cow::Borrowed(&**n)
            }
        })
        .collect()
}

/// A path's weight in the folded stacks: nanoseconds of self time. Paths
/// that round to 0 are left out.
pub(super) fn folded_weight(st: &StackRow) -> u64 {
    (st.self_ms * 1e6).round() as u64
}

/// The flame graph of the folded stacks.
pub fn render_svg(r: &Report) -> Result<String, String> {
    let mut folded = String::new();
    let sorted = folded_to(r, &mut folded).map_err(|e| e.to_string())?;
    if folded.is_empty() {
        return Ok(String::new());
    }
    let mut out = Vec::new();
    svg_to(r, Some(&folded), sorted, &mut out).map_err(|e| e.to_string())?;
    String::from_utf8(out).map_err(|e| e.to_string())
}

/// `paths` (frames numbered in `names`) with only the names they use,
/// renumbered in order of first use.
fn used_names(names: &[Arc<str>], mut paths: Vec<StackRow>) -> Stacks {
    let mut new_id = vec![u32::MAX; names.len()];
    let mut used = Vec::new();
    for f in paths.iter_mut().flat_map(|p| p.frames.iter_mut()) {
        let id = &mut new_id[*f as usize];
        if *id == u32::MAX {
            *id = used.len() as u32;
            used.push(names[*f as usize].clone());
        }
        *f = *id;
    }
    Stacks { names: used, paths }
}

/// A report of `stacks` alone, the rest made up (tests).
#[cfg(test)]
pub(super) fn test_report(stacks: Stacks) -> Report {
    Report {
        schema: "test".into(),
        program: "t".into(),
        pid: 1,
        wall_ms: 1.0,
        tsc_mhz: 1.0,
        settings: SettingsOut {
            samples_per_window: 10,
            epoch_ms: 10.0,
            inlined: false,
        },
        overhead: Overhead::default(),
        functions: Vec::new(),
        edges: Vec::new(),
        stacks,
    }
}

/// Paths built by hand (tests) put in order and merged as [`collect`] does.
#[cfg(test)]
pub(super) fn order_and_merge(st: &mut Stacks) {
    let mut tree = PathTree::default();
    for (i, n) in st.names.iter().enumerate() {
        tree.name(i as u32, n);
    }
    for r in &st.paths {
        let node = tree.path(&r.frames);
        tree.end(node, r.samples, r.self_ms);
    }
    *st = used_names(&st.names, tree.rows(&st.names));
}

/// A frame's name as the folded stacks write it: `;` separates frames and
/// ` ` the weight.
pub(super) fn folded_name(name: &str) -> impl Iterator<Item = u8> + '_ {
    name.bytes().map(|c| if c == b';' || c == b' ' { b'_' } else { c })
}

/// The flame graph of `r`'s folded stacks into `out`, whose lines are
/// `sorted` as inferno compares them; `folded` is [`render_folded`]'s
/// output, if made (only unsorted lines need it).
fn svg_to(r: &Report, folded: Option<&str>, sorted: bool, out: &mut impl std::io::Write) -> std::io::Result<()> {
    let mut opt = flame_options(r);
    // Reports list their paths in the flame graph's order (`by_frames`), so
    // its own sort, which compared every line as a string again, is needed
    // only when two paths print alike (and for older reports).
    if sorted {
        // The same flame graph from the frames it draws (`flame.rs`), whose
        // lines keep the folded order without sorting: a flame chart is
        // inferno's way to take lines in the order given (it reverses them
        // first, and does nothing else differently).
        let cut = super::flame::drawable(r, opt.min_width);
        if super::svg::write(r, &cut, out)? {
            return Ok(());
        }
        opt.flame_chart = true;
        return inferno::flamegraph::from_lines(&mut opt, cut.text().lines().rev(), out);
    }
    let made;
    let folded = match folded {
        Some(f) => f,
        None => {
            made = render_folded(r);
            &made
        }
    };
    inferno::flamegraph::from_lines(&mut opt, folded.lines(), out)
}

/// The flame graph's options for `r` (sorting aside).
pub(super) fn flame_options(r: &Report) -> inferno::flamegraph::Options<'static> {
    let mut opt = inferno::flamegraph::Options::default();
    opt.title = format!("fastinst profile: {} (pid {})", r.program, r.pid);
    opt.count_name = "ns".into();
    // Colours from the names' hashes: a function has the same colour in
    // every report, and a report renders the same each time (inferno's
    // default draws them from a generator that carries on from one graph
    // to the next in a process).
    opt.hash = true;
    opt
}

/// Whether inferno takes `folded`'s lines as sorted (the check
/// [`folded_to`] makes as it writes them, for the tests).
#[cfg(test)]
pub(super) fn lines_sorted(folded: &str) -> bool {
    let mut prev = "";
    folded.lines().all(|line| std::mem::replace(&mut prev, line) <= line)
}

/// Writes `fastinst-profile.<pid>.{txt,json,folded,svg}` under `dir`;
/// returns the paths, the text report first.
///
/// Written at the program's exit, so this is part of the profiler's cost.
/// Every file is streamed through one 64 KiB buffer each: the JSON is
/// compact (pretty-printed it was 3.5 MB on SQLite and a third of the time
/// spent here; `fastinst report --format json FILE` pretty-prints it), and
/// the text, the folded stacks and the flame graph are no longer built
/// whole in memory first (1-3 MB of strings for text that went straight to
/// a file: 0.3-0.6 ms of the reports on QuickJS and SQLite; the page faults
/// stayed about the same, `malloc` reusing freed memory).
pub fn write_all(r: &Report, dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    write_named(r, dir, "fastinst-profile")
}

/// [`write_all`] with another file name stem (`<stem>.<pid>.<ext>`).
pub fn write_named(r: &Report, dir: &Path, stem: &str) -> std::io::Result<Vec<PathBuf>> {
    use std::io::Write as _;
    let path = |ext: &str| dir.join(format!("{stem}.{}.{ext}", r.pid));
    let mut out = Vec::new();
    // The writer is a concrete type, not `dyn Write`: serde_json writes
    // the JSON in ~500,000 small pieces, each then a call through a vtable
    // where it could be an inlined copy into the buffer.
    type Out = std::io::BufWriter<std::fs::File>;
    let mut last = std::time::Instant::now();
    let mut put = |p: PathBuf, write: &mut dyn FnMut(&mut Out) -> std::io::Result<()>| {
        let tmp = p.with_extension("tmp");
        let mut file = std::io::BufWriter::with_capacity(1 << 16, std::fs::File::create(&tmp)?);
        let written = write(&mut file).and_then(|()| file.into_inner().map(drop).map_err(|e| e.into_error()));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        std::fs::rename(&tmp, &p)?;
        let now = std::time::Instant::now();
        crate::log::debug(format_args!("profile: {} written in {:?}", p.display(), now - last));
        last = now;
        out.push(p);
        Ok::<(), std::io::Error>(())
    };
    put(path("txt"), &mut |w| fmt_io(w, |f| text_to(r, f)))?;
    put(path("json"), &mut |w| {
        super::json::write(r, w)?;
        w.write_all(b"\n")
    })?;
    if r.stacks.paths.iter().any(|st| folded_weight(st) > 0) {
        let mut sorted = false;
        put(path("folded"), &mut |w| {
            fmt_io(w, |f| folded_to(r, f).map(|s| sorted = s))
        })?;
        // A flame graph that cannot be drawn is reported, and the other
        // files are written all the same.
        if let Err(e) = put(path("svg"), &mut |w| svg_to(r, None, sorted, w)) {
            crate::log::error(format_args!("profile: no flame graph: {e}"));
        }
    }
    Ok(out)
}

/// Runs `write` on a [`std::fmt::Write`] view of `w`, returning the first
/// I/O error it met.
fn fmt_io<W: std::io::Write>(
    w: &mut W,
    write: impl FnOnce(&mut FmtIo<'_, W>) -> std::fmt::Result,
) -> std::io::Result<()> {
    let mut f = FmtIo { w, err: None };
    match (write(&mut f), f.err) {
        (_, Some(e)) => Err(e),
        (Err(_), None) => Err(std::io::Error::other("formatting failed")),
        (Ok(()), None) => Ok(()),
    }
}

/// A [`std::fmt::Write`] over an [`std::io::Write`] that keeps the first
/// I/O error (`fmt::Error` carries none).
struct FmtIo<'a, W> {
    w: &'a mut W,
    err: Option<std::io::Error>,
}

impl<W: std::io::Write> std::fmt::Write for FmtIo<'_, W> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.w.write_all(s.as_bytes()).map_err(|e| {
            self.err.get_or_insert(e);
            std::fmt::Error
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tables' rows, written by hand, are what `{:>W.P}` per field
    /// writes.
    #[test]
    fn text_rows_are_what_the_format_widths_write() {
        let mut rng = crate::profile::test_rng::Rng(0x2545_F491_4F6C_DD1D);
        let mut num = move || {
            let r = rng.next_u64();
            let x = rng.unit() * 10f64.powi((r % 18) as i32 - 6);
            // Now and then a half at two or three places, or a huge one.
            match r >> 60 {
                0 => (r % 1000) as f64 / 1000.0 + 0.0005,
                1 => (r % 100) as f64 / 100.0 + 0.005,
                2 => 1e15 * x,
                _ => x,
            }
        };
        let functions: Vec<FunctionRow> = (0..400)
            .map(|i| FunctionRow {
                name: format!("f{i} <g>"),
                address: format!("{:#x}", 0x1000 + i),
                calls_sampled: (num() * 1e3) as u64,
                calls_estimated: num(),
                total_ms: num(),
                self_ms: num(),
                mean_us: num(),
                min_us: num(),
                p50_us: num(),
                p90_us: num(),
                p99_us: num(),
                max_us: num(),
                threads: vec![1; i % 12],
            })
            .collect();
        let edges: Vec<EdgeRow> = (0..400)
            .map(|i| EdgeRow {
                caller: format!("c{i}"),
                callee: format!("f{i}"),
                calls_sampled: i as u64 * 977,
                calls_estimated: num(),
                total_ms: num(),
            })
            .collect();
        let mut want = String::new();
        for f in &functions {
            writeln!(
                want,
                "{:>12.0} {:>8} {:>10.3} {:>10.3} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2}  {:<8} {}",
                f.calls_estimated,
                f.calls_sampled,
                f.total_ms,
                f.self_ms,
                f.min_us,
                f.p50_us,
                f.p90_us,
                f.p99_us,
                f.max_us,
                f.mean_us,
                f.threads.len(),
                f.name
            )
            .unwrap();
        }
        let mut want_edges = String::new();
        for e in &edges {
            writeln!(
                want_edges,
                "{:>12.0} {:>8} {:>10.3}  {} -> {}",
                e.calls_estimated, e.calls_sampled, e.total_ms, e.caller, e.callee
            )
            .unwrap();
        }
        let r = Report {
            functions,
            edges,
            ..test_report(Stacks::default())
        };
        let text = render_text(&r);
        let rows = text.split_once(" function\n").expect("the functions' header").1;
        let (rows, edge_rows) = rows
            .split_once("\ncall edges (caller -> callee): calls(est), sampled, total ms\n")
            .expect("the edges' header");
        assert_eq!(rows, want);
        assert_eq!(edge_rows, want_edges);
    }

    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    struct Wrap {
        stacks: Stacks,
    }

    #[test]
    fn stacks_are_written_with_a_names_table_and_read_in_both_forms() {
        let s = Wrap {
            stacks: Stacks::from_named([(vec!["main", "[...]", "f"], 3, 1.5), (vec!["main", "g"], 1, 0.5)]),
        };
        assert_eq!(s.stacks.names.len(), 4, "each name once");
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(
            json,
            r#"{"stacks":{"names":["main","[...]","f","g"],"paths":[{"frames":[0,1,2],"samples":3,"self_ms":1.5},{"frames":[0,3],"samples":1,"self_ms":0.5}]}}"#
        );
        assert_eq!(serde_json::from_str::<Wrap>(&json).unwrap(), s);
        let v1 = r#"{"stacks":[{"frames":["main","[...]","f"],"samples":3,"self_ms":1.5},{"frames":["main","g"],"samples":1,"self_ms":0.5}]}"#;
        assert_eq!(serde_json::from_str::<Wrap>(v1).unwrap(), s);
        let row = &s.stacks.paths[0];
        assert_eq!(s.stacks.frames(row).collect::<Vec<_>>(), ["main", "[...]", "f"]);
        let bad = r#"{"stacks":{"names":["main"],"paths":[{"frames":[0,1],"samples":1,"self_ms":0}]}}"#;
        assert!(serde_json::from_str::<Wrap>(bad).is_err());
    }

    #[test]
    fn a_broken_stacks_field_is_named_by_what_is_wrong_in_it() {
        let err = |j: &str| serde_json::from_str::<Wrap>(j).unwrap_err().to_string();
        let e = err(r#"{"stacks":{"names":["main"],"paths":[{"frames":[0],"samples":"x","self_ms":0}]}}"#);
        assert!(e.contains("invalid type: string \"x\", expected u64"), "{e}");
        let e = err(r#"{"stacks":{"names":["main"]}}"#);
        assert!(e.contains("missing field `paths`"), "{e}");
        let e = err(r#"{"stacks":[{"frames":["main"],"self_ms":0}]}"#);
        assert!(e.contains("missing field `samples`"), "{e}");
        let e = err(r#"{"stacks":{"names":["main"],"paths":[{"frames":[3],"samples":1,"self_ms":0}]}}"#);
        assert!(e.contains("a stack's frame indexes past the 1 names"), "{e}");
        let e = err(r#"{"stacks":7}"#);
        assert!(e.contains("expected stacks as {names, paths}"), "{e}");
    }

    #[test]
    fn merged_paths_keep_only_the_names_they_use() {
        let mut st = Stacks::from_named([
            (vec!["main", "g h"], 1, 1.0),
            (vec!["unused"], 0, 0.0),
            (vec!["main", "g_h"], 2, 2.0),
        ]);
        st.paths.remove(1);
        order_and_merge(&mut st);
        // `g h` and `g_h` print alike: one path, under one of the two.
        assert_eq!(st.paths.len(), 1);
        assert_eq!(st.paths[0].samples, 3);
        assert_eq!(st.names.len(), 2, "{:?}", st.names);
        let frames: Vec<&str> = st.frames(&st.paths[0]).collect();
        assert!(frames == ["main", "g h"] || frames == ["main", "g_h"], "{frames:?}");
    }

    #[test]
    fn paths_order_as_their_folded_lines_sort() {
        let names: Vec<Arc<str>> = ["main", "f", "f.cold", "f2", "g h", "g;h", "g_h", "a:b", "a", "ab", "a0"]
            .into_iter()
            .map(Arc::from)
            .collect();
        // Every path of up to three frames over these names.
        let mut paths: Vec<Vec<Arc<str>>> = Vec::new();
        for x in &names {
            paths.push(vec![x.clone()]);
            for y in &names {
                paths.push(vec![x.clone(), y.clone()]);
                for z in names.iter().step_by(3) {
                    paths.push(vec![Arc::from(&**x), y.clone(), z.clone()]);
                }
            }
        }
        let mut st = Stacks::from_named(paths.into_iter().map(|frames| (frames, 1, 1.0)));
        order_and_merge(&mut st);
        let lines: Vec<String> = st
            .paths
            .iter()
            .map(|p| {
                let frames: Vec<String> = st
                    .frames(p)
                    .map(|f| String::from_utf8(folded_name(f).collect()).unwrap())
                    .collect();
                format!("{} 7", frames.join(";"))
            })
            .collect();
        for w in lines.windows(2) {
            assert!(
                w[0] < w[1],
                "{:?} before {:?}: out of order, or alike and not merged",
                w[0],
                w[1]
            );
        }
    }
}
