//! Where a profiled run's CPU time goes, as shares of its own CPU samples.
//!
//! Table 3 compares the CPU time of separate runs, and on a shared virtual
//! machine whose speed drifts by several percent between runs that cannot
//! resolve a 1-3% question without hundreds of rounds. A share of one run's
//! own samples does not depend on how fast the machine was during it: every
//! part of the run was slowed alike. So `fastinst-shares` records each run
//! with `perf record -g` (the `cpu-clock` software event, which needs no
//! hardware counters) against a build of `libfastinst.so` with frame
//! pointers, and sorts every sample into the part of the runtime that took
//! it ([`Phase`]), by its call chain:
//!
//! - the chain passes through the sampler thread's loop: [`Phase::Sampler`];
//! - through the reports written at exit: [`Phase::Reports`];
//! - through start-up (the preload constructor, sled registration, probe
//!   discovery): [`Phase::Startup`];
//! - through a hook, handler or trampoline: [`Phase::Handlers`];
//! - any other frame of the runtime: [`Phase::OtherRuntime`].
//!
//! A sample is the program's own ([`Phase::App`]) when the innermost frame
//! that belongs to the program or to the runtime (C library and kernel
//! frames are skipped) is the program's: `malloc` called by the program is
//! the program's, `malloc` called by the report is the report's, and a page
//! fault is charged to the code that touched the page. Kernel samples with
//! no user frame at all (exec, exit, the kernel's own work) are
//! [`Phase::Kernel`].
//!
//! What this measures is the runtime's *direct* cost: the time its own code
//! (and the kernel on its behalf) ran. What it cannot see is the indirect
//! cost, the program's own code running slower because the runtime evicted
//! its cache lines; that part shows only in a comparison of runs (Table 3).

use std::collections::BTreeMap;

/// The part of a run a CPU sample is charged to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
pub enum Phase {
    /// The program's own code, and what the kernel and C library did for it.
    App,
    /// Hooks, probe handlers, sled trampolines, and the switches they make.
    Handlers,
    /// The sampler thread: its wake-ups and each epoch's re-activations.
    Sampler,
    /// The reports written at exit.
    Reports,
    /// The preload constructor, sled registration and probe discovery.
    Startup,
    /// Runtime code outside those (fork handlers, signal handlers).
    OtherRuntime,
    /// Kernel work with no user frame on its chain (exec, exit).
    Kernel,
}

/// Every phase, in the order tables list them.
pub const PHASES: [Phase; 7] = [
    Phase::App,
    Phase::Handlers,
    Phase::Sampler,
    Phase::Reports,
    Phase::Startup,
    Phase::OtherRuntime,
    Phase::Kernel,
];

impl Phase {
    /// Short name, as column headings use it.
    pub fn name(self) -> &'static str {
        match self {
            Phase::App => "app",
            Phase::Handlers => "handlers",
            Phase::Sampler => "sampler",
            Phase::Reports => "reports",
            Phase::Startup => "start-up",
            Phase::OtherRuntime => "other runtime",
            Phase::Kernel => "kernel (no user frame)",
        }
    }

    /// Whether the runtime's own work is charged here.
    pub fn is_runtime(self) -> bool {
        !matches!(self, Phase::App | Phase::Kernel)
    }
}

/// Markers in the runtime's function names, checked in this order against
/// the whole chain: the first phase with a marker on it wins (a report's
/// `malloc` may fault: the fault is the report's).
const MARKERS: [(Phase, &[&str]); 4] = [
    (Phase::Sampler, &["fastinst::profile::sampler::"]),
    (Phase::Reports, &["fastinst::profile::output::", "fastinst_report::"]),
    (
        Phase::Startup,
        &[
            "fastinst::ctor",
            "fastinst::process::start_from_env",
            "fastinst::sled::load",
            "fastinst::sled::register_module",
            "fastinst::sled::library_loading",
            "fastinst::discovery::",
            "fastinst::modules::",
        ],
    ),
    (
        Phase::Handlers,
        &[
            "fastinst::profile::handlers::",
            "fastinst::hooks::",
            "fastinst::sled::shadow::",
            "fastinst_sled_",
            "__cyg_profile_func_",
        ],
    ),
];

/// One frame of a sample's call chain: its symbol and the file it lies in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    /// Symbol (`[unknown]` when perf has none).
    pub sym: String,
    /// Object file, or `[kernel.kallsyms]`, `[unknown]`.
    pub dso: String,
}

impl Frame {
    fn is_kernel(&self) -> bool {
        self.dso.starts_with("[kernel")
    }
}

/// Which object files are which.
#[derive(Clone, Debug)]
pub struct Objects {
    /// The runtime's file name (`libfastinst.so`, or whatever it was
    /// copied to), matched against the end of a frame's object path.
    pub runtime: String,
    /// The program's file name.
    pub program: String,
}

/// Whose code a frame is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Owner {
    Program,
    Runtime,
}

impl Objects {
    fn owner(&self, f: &Frame) -> Option<Owner> {
        if f.dso.ends_with(&self.runtime) {
            Some(Owner::Runtime)
        } else if f.dso.ends_with(&self.program) {
            Some(Owner::Program)
        } else {
            None
        }
    }
}

/// The phase of a sample whose chain is `frames`, innermost first.
pub fn classify(frames: &[Frame], objects: &Objects) -> Phase {
    // The first user frame is where the sample (or the kernel entry under
    // it) was taken, read from the registers; only there can code in
    // anonymous memory be told apart from a chain walked into garbage
    // (the programs' own code keeps no frame pointers, so a walk that
    // starts in the C library under them goes astray). A few addresses
    // perf could not map land here too: 0.00-0.01% of the plain builds'
    // samples on 2026-11-24.
    let first_user = frames.iter().find(|f| !f.is_kernel());
    if first_user.is_some_and(|f| f.dso == "[unknown]" && f.sym == "[unknown]") {
        return Phase::Handlers;
    }
    match frames.iter().find_map(|f| objects.owner(f)) {
        None if frames.iter().all(Frame::is_kernel) => Phase::Kernel,
        // Only the C library or the loader: start-up before the program's
        // main and the runtime's constructor, or exit.
        None | Some(Owner::Program) => Phase::App,
        Some(Owner::Runtime) => MARKERS
            .iter()
            .find(|(_, marks)| frames.iter().any(|f| marks.iter().any(|m| f.sym.contains(m))))
            .map_or(Phase::OtherRuntime, |(phase, _)| *phase),
    }
}

/// Samples by phase, over any number of runs of one configuration.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct Shares {
    /// Samples charged to each phase.
    pub samples: BTreeMap<Phase, u64>,
    /// Runs recorded.
    pub runs: usize,
}

impl Shares {
    /// All samples.
    pub fn total(&self) -> u64 {
        self.samples.values().sum()
    }

    /// `phase`'s share of all samples, in percent.
    pub fn pct(&self, phase: Phase) -> f64 {
        100.0 * self.samples.get(&phase).copied().unwrap_or(0) as f64 / self.total().max(1) as f64
    }

    /// The runtime's samples over the rest: the slowdown its direct cost
    /// alone makes, in percent (a run with `r` runtime samples out of `t`
    /// would have taken `t - r` without them).
    pub fn direct_slowdown_pct(&self) -> f64 {
        let runtime: u64 = self
            .samples
            .iter()
            .filter(|(p, _)| p.is_runtime())
            .map(|(_, n)| n)
            .sum();
        100.0 * runtime as f64 / (self.total() - runtime).max(1) as f64
    }

    /// The samples of every phase outside `base` over those in it, in
    /// percent: against the floor, `base` is the program and start-up (the
    /// floor pays start-up too); against the plain build, the program
    /// alone.
    pub fn cost_over(&self, base: &[Phase]) -> f64 {
        let (inside, outside) =
            self.samples.iter().fold(
                (0, 0),
                |(i, o), (p, n)| {
                    if base.contains(p) {
                        (i + n, o)
                    } else {
                        (i, o + n)
                    }
                },
            );
        100.0 * outside as f64 / inside.max(1) as f64
    }

    /// Adds the samples of `perf script -F pid,tid,ip,sym,dso` output.
    /// Returns how many samples it read.
    pub fn add_script(&mut self, text: &str, objects: &Objects) -> usize {
        let mut n = 0;
        for block in text.split("\n\n") {
            let mut lines = block.lines().filter(|l| !l.trim().is_empty());
            if lines.next().is_none() {
                continue;
            }
            let frames: Vec<Frame> = lines.filter_map(parse_frame).collect();
            if frames.is_empty() {
                continue;
            }
            *self.samples.entry(classify(&frames, objects)).or_default() += 1;
            n += 1;
        }
        n
    }
}

/// A `fastinst-shares` run as its `--json` writes it.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Saved {
    /// The table's heading: what was run, when, where.
    pub header: String,
    /// One row per program, build and configuration.
    pub rows: Vec<SavedRow>,
}

/// One configuration's samples in a [`Saved`] run.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct SavedRow {
    /// Program name (`quickjs`).
    pub program: String,
    /// Build name (`gcc`, `clang-sled`).
    pub build: String,
    /// Configuration name (`plain`, `floor`, `profile`).
    pub config: String,
    /// Its samples.
    pub shares: Shares,
}

impl Saved {
    /// The direct cost of `program`'s profile runs on `build`, in percent,
    /// against the baseline its target names: a `-finstrument-functions`
    /// build against its floor (the program and start-up, which the floor
    /// pays too), a sled build against the plain build (the program alone;
    /// the sleds' NOPs run inside it and are not in this figure).
    pub fn direct_cost(&self, program: &str, build: &str) -> Option<f64> {
        let base: &[Phase] = if build.ends_with("-sled") {
            &[Phase::App, Phase::Kernel]
        } else {
            &[Phase::App, Phase::Kernel, Phase::Startup]
        };
        self.rows
            .iter()
            .find(|r| r.program == program && r.build == build && r.config == "profile")
            .map(|r| r.shares.cost_over(base))
    }
}

/// One chain line of `perf script`: `\t<ip> <symbol> (<dso>)`; the symbol
/// may hold spaces and parentheses, the object is the last parenthesised
/// part.
fn parse_frame(line: &str) -> Option<Frame> {
    let line = line.trim();
    let (head, dso) = line.strip_suffix(')')?.rsplit_once(" (")?;
    let sym = head.split_once(' ').map_or("[unknown]", |(_, s)| s.trim());
    Some(Frame {
        sym: sym.to_string(),
        dso: dso.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn objects() -> Objects {
        Objects {
            runtime: "libfastinst.so".into(),
            program: "quickjs-gcc-inst".into(),
        }
    }

    const LIB: &str = "/w/target/fp/release/libfastinst.so";
    const APP: &str = "/w/bin/quickjs-gcc-inst";
    const LIBC: &str = "/usr/lib/x86_64-linux-gnu/libc.so.6";
    const K: &str = "[kernel.kallsyms]";

    fn sample(frames: &[(&str, &str)]) -> String {
        let mut s = String::from("4242/4242 \n");
        for (sym, dso) in frames {
            s.push_str(&format!("\tffffffff81000c82 {sym} ({dso})\n"));
        }
        s.push('\n');
        s
    }

    fn phase_of(frames: &[(&str, &str)]) -> Phase {
        let mut sh = Shares::default();
        assert_eq!(sh.add_script(&sample(frames), &objects()), 1);
        *sh.samples.keys().next().expect("one sample")
    }

    #[test]
    fn a_sample_goes_to_the_innermost_owner_and_the_phase_on_its_chain() {
        // The program's own code, and the C library called by it.
        assert_eq!(phase_of(&[("JS_CallInternal", APP), ("main", APP)]), Phase::App);
        assert_eq!(phase_of(&[("_int_malloc", LIBC), ("js_def_malloc", APP)]), Phase::App);
        // A fault taken by the program is the program's.
        assert_eq!(
            phase_of(&[
                ("clear_page_erms", K),
                ("exc_page_fault", K),
                ("_int_malloc", LIBC),
                ("js_new", APP)
            ]),
            Phase::App
        );
        // The C library called by the report, and a fault under it.
        assert_eq!(
            phase_of(&[
                ("copy_folio_from_iter_atomic", K),
                ("__GI___libc_write", LIBC),
                ("std::io::buffered::bufwriter::BufWriter<W>::flush_buf", LIB),
                ("fastinst_report::write_all", LIB),
                ("fastinst::profile::output::write_reports", LIB),
                ("fastinst::at_exit", LIB),
            ]),
            Phase::Reports
        );
        // A handler under the sled's return trampoline, itself called from
        // the program: the innermost owner is the runtime.
        assert_eq!(
            phase_of(&[
                ("fastinst::profile::thread::Shadow::path_node", LIB),
                ("fastinst::profile::handlers::on_exit", LIB),
                ("fastinst::sled::shadow::sled_return", LIB),
                ("fastinst_sled_return_avx512", LIB),
                ("JS_CallInternal", APP),
            ]),
            Phase::Handlers
        );
        // The program's code under a substituted return address is still
        // the program's.
        assert_eq!(
            phase_of(&[("JS_GetPropertyInternal", APP), ("fastinst_sled_return_avx512", LIB)]),
            Phase::App
        );
        // The sampler's sleep, and its switches.
        assert_eq!(
            phase_of(&[
                ("schedule", K),
                ("clock_nanosleep", LIBC),
                ("fastinst::profile::sampler::sampler_raw", LIB)
            ]),
            Phase::Sampler
        );
        assert_eq!(
            phase_of(&[
                ("wordpatch::raw::store_in_line", LIB),
                ("fastinst::profile::sampler::rearm", LIB),
                ("fastinst::profile::sampler::epoch", LIB),
                ("fastinst::profile::sampler::sampler_raw", LIB),
            ]),
            Phase::Sampler
        );
        // Discovery on a hook's first call is start-up, not a handler.
        assert_eq!(
            phase_of(&[
                ("iced_x86::decoder::Decoder::decode_out_ptr", LIB),
                ("fastinst::discovery::discover", LIB),
                ("fastinst::hooks::slow", LIB),
                ("__cyg_profile_func_enter", LIB),
                ("main", APP),
            ]),
            Phase::Startup
        );
        // A stub in anonymous memory (the sleds' stubs, the callpatch
        // trampolines; none of these programs makes code) is the runtime's;
        // an unknown frame further out is a chain walked astray.
        assert_eq!(
            phase_of(&[("[unknown]", "[unknown]"), ("js_call", APP)]),
            Phase::Handlers
        );
        assert_eq!(
            phase_of(&[("page_fault", K), ("[unknown]", "[unknown]")]),
            Phase::Handlers
        );
        assert_eq!(
            phase_of(&[("_int_malloc", LIBC), ("[unknown]", "[unknown]"), ("x", LIB)]),
            Phase::OtherRuntime
        );
        assert_eq!(
            phase_of(&[("_int_malloc", LIBC), ("[unknown]", "[unknown]")]),
            Phase::App
        );
        assert_eq!(phase_of(&[("fastinst::heap::State::alloc", LIB)]), Phase::OtherRuntime);
        // Exec and exit, and the loader before anything ran.
        assert_eq!(phase_of(&[("elf_load", K), ("load_elf_binary", K)]), Phase::Kernel);
        assert_eq!(
            phase_of(&[("_dl_relocate_object", "/usr/lib/ld-linux-x86-64.so.2")]),
            Phase::App
        );
    }

    #[test]
    fn shares_and_the_direct_slowdown_count_every_sample_once() {
        let mut sh = Shares::default();
        let mut text = String::new();
        for _ in 0..90 {
            text.push_str(&sample(&[("main", APP)]));
        }
        for _ in 0..6 {
            text.push_str(&sample(&[
                ("fastinst::profile::handlers::on_entry", LIB),
                ("main", APP),
            ]));
        }
        for _ in 0..3 {
            text.push_str(&sample(&[("fastinst::profile::sampler::sampler_raw", LIB)]));
        }
        text.push_str(&sample(&[("do_exit", K)]));
        assert_eq!(sh.add_script(&text, &objects()), 100);
        assert_eq!(sh.total(), 100);
        assert!((sh.pct(Phase::Handlers) - 6.0).abs() < 1e-9);
        assert!((sh.pct(Phase::Sampler) - 3.0).abs() < 1e-9);
        assert!((sh.pct(Phase::Kernel) - 1.0).abs() < 1e-9);
        // 9 runtime samples over the other 91.
        assert!((sh.direct_slowdown_pct() - 900.0 / 91.0).abs() < 1e-9);
        assert!((sh.cost_over(&[Phase::App, Phase::Kernel, Phase::Sampler]) - 600.0 / 94.0).abs() < 1e-9);
    }

    #[test]
    fn direct_cost_is_read_against_each_targets_baseline() {
        let shares = |app, startup, handlers| Shares {
            samples: [
                (Phase::App, app),
                (Phase::Startup, startup),
                (Phase::Handlers, handlers),
            ]
            .into(),
            runs: 1,
        };
        let row = |build: &str, config: &str, s: Shares| SavedRow {
            program: "quickjs".into(),
            build: build.into(),
            config: config.into(),
            shares: s,
        };
        let saved = Saved {
            header: String::new(),
            rows: vec![
                row("gcc", "floor", shares(95, 5, 0)),
                row("gcc", "profile", shares(90, 5, 5)),
                row("gcc-sled", "profile", shares(90, 5, 5)),
            ],
        };
        // The floor pays start-up too: handlers over program and start-up.
        assert!((saved.direct_cost("quickjs", "gcc").unwrap() - 500.0 / 95.0).abs() < 1e-9);
        // Against the plain build, start-up is the runtime's.
        assert!((saved.direct_cost("quickjs", "gcc-sled").unwrap() - 1000.0 / 90.0).abs() < 1e-9);
        assert_eq!(saved.direct_cost("quickjs", "clang"), None);
        assert_eq!(saved.direct_cost("sqlite", "gcc"), None);
    }

    #[test]
    fn symbols_with_spaces_and_parentheses_parse() {
        let f = parse_frame("\t 7f00 <alloc::vec::Vec<T> as core::ops::Drop>::drop (x) (/a b/lib.so)").expect("parses");
        assert_eq!(f.sym, "<alloc::vec::Vec<T> as core::ops::Drop>::drop (x)");
        assert_eq!(f.dso, "/a b/lib.so");
        let f = parse_frame("\tffffffff81000c82 ([kernel.kallsyms])").expect("parses");
        assert_eq!(f.sym, "[unknown]");
    }
}
