//! What the CPU samples cannot see, counted by a cache simulator.
//!
//! `fastinst-shares` measures the runtime's direct cost: the time its own
//! code ran. Two more parts of a profiled run's slowdown do not show there:
//!
//! - the **sleds' NOPs**: a `-fpatchable-function-entry` build executes one
//!   NOP per function call whether or not a probe is on; they run inside
//!   the program's own functions;
//! - the **indirect cost**: the program's own code missing in caches the
//!   runtime's handlers, sampler and reports filled with their lines.
//!
//! On a quiet machine a comparison of runs (Table 3) shows both; on this
//! project's shared virtual machines two runs of the *same* binary differ by
//! 10-20% (sd of paired runs), so a 1% effect cannot be seen that way. A
//! simulator's counts do not depend on the machine's speed: `fastinst-cachesim`
//! runs each program under Valgrind's callgrind (plain build, the build
//! with every probe off, and under the profiler) and compares the
//! *program's* side of the counts between them ([`Sides`]):
//!
//! - NOPs (and whatever else the instrumented build's code does
//!   differently): program side, floor over plain;
//! - indirect cost: program side, profile over floor (same binary, same
//!   code, so the difference is the runtime's effect on the program).
//!
//! Counts become cycles by KCachegrind's cycle estimate, one cycle per
//! instruction, 10 per first-level miss and 100 per last-level miss
//! ([`Counts::cycles`]); the simulated caches are the machine's first level
//! (32 KiB, 8-way, instruction and data) and its per-core second level
//! (1 MiB) as the last level, so that a line the runtime evicted to the
//! shared L3 counts as a full miss. This is a model, not a measurement of
//! time: it says how large the two effects are in instructions and misses,
//! which a measurement of time here cannot resolve.
//!
//! What the program's side holds: every function that is not the
//! runtime's ([`is_runtime`]), the C library's among them, *less* the C
//! library's string and allocator functions where the runtime's own code
//! called them ([`Sides::runtime_calls`]): the reports' `memcpy`, the
//! profile's `malloc`. `fastinst-shares` charges those to the runtime by
//! their call chains, so counted on the program's side too they were
//! counted twice (on SQLite's gcc sled build they were 60% of what the
//! simulator called indirect cost). Telling them apart takes call edges,
//! which is why the simulator is Valgrind's callgrind with its cache
//! simulation (the same simulation as cachegrind's, with a call graph);
//! C code called from the runtime that is not on that list of leaf
//! functions (`dl_iterate_phdr`, whose callback is the runtime's, say)
//! stays on the program's side, so the estimate can only err high.

use crate::error::{EvalError, Result};
use std::ops::{Add, Sub};

/// The simulator's counts for some code.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Counts {
    /// Instructions executed (`Ir`).
    pub instructions: u64,
    /// First-level cache misses: instruction reads, data reads and data
    /// writes (`I1mr + D1mr + D1mw`).
    pub l1_misses: u64,
    /// Last-level cache misses, same three kinds (`ILmr + DLmr + DLmw`).
    pub ll_misses: u64,
}

impl Counts {
    /// KCachegrind's cycle estimate: `Ir + 10 L1m + 100 LLm`.
    pub fn cycles(&self) -> f64 {
        self.instructions as f64 + 10.0 * self.l1_misses as f64 + 100.0 * self.ll_misses as f64
    }
}

impl Add for Counts {
    type Output = Counts;
    fn add(self, o: Counts) -> Counts {
        Counts {
            instructions: self.instructions + o.instructions,
            l1_misses: self.l1_misses + o.l1_misses,
            ll_misses: self.ll_misses + o.ll_misses,
        }
    }
}

/// The difference of two sets of counts, which may be negative.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Delta {
    /// Instructions.
    pub instructions: i64,
    /// First-level misses.
    pub l1_misses: i64,
    /// Last-level misses.
    pub ll_misses: i64,
}

impl Delta {
    /// The estimate's cycles for this difference.
    pub fn cycles(&self) -> f64 {
        self.instructions as f64 + 10.0 * self.l1_misses as f64 + 100.0 * self.ll_misses as f64
    }

    /// This difference as a percentage of `base`'s estimated cycles.
    pub fn pct_of(&self, base: &Counts) -> f64 {
        100.0 * self.cycles() / base.cycles()
    }
}

impl Sub for Counts {
    type Output = Delta;
    fn sub(self, o: Counts) -> Delta {
        let d = |a: u64, b: u64| a as i64 - b as i64;
        Delta {
            instructions: d(self.instructions, o.instructions),
            l1_misses: d(self.l1_misses, o.l1_misses),
            ll_misses: d(self.ll_misses, o.ll_misses),
        }
    }
}

/// One run's counts, split between the program and the runtime.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Sides {
    /// The program's functions, the C library and the dynamic loader, and
    /// code outside any symbol (PLT entries, the runtime's sled stubs).
    pub program: Counts,
    /// The runtime's own functions.
    pub runtime: Counts,
    /// Of `program`: the C library's string and allocator functions run
    /// by the runtime's calls ([`is_leaf_library_function`]), inclusive.
    /// Absent (zero) in files written before it was counted.
    #[serde(default)]
    pub runtime_calls: Counts,
}

impl Sides {
    /// The program's side without what the runtime's calls ran:
    /// [`Sides::program`] less [`Sides::runtime_calls`].
    pub fn program_own(&self) -> Counts {
        Counts {
            instructions: self
                .program
                .instructions
                .saturating_sub(self.runtime_calls.instructions),
            l1_misses: self.program.l1_misses.saturating_sub(self.runtime_calls.l1_misses),
            ll_misses: self.program.ll_misses.saturating_sub(self.runtime_calls.ll_misses),
        }
    }
}

/// Whether the function `name`, from source file `file` (`???` when the
/// object has no line tables), is the runtime's. The programs are C, whose
/// function names never hold `::`; every Rust function's demangled name
/// does (Valgrind demangles; a legacy-mangled `_ZN` name is caught too).
/// The runtime's assembly entry points are named `fastinst_*`, and its
/// line tables name files under the workspace's `crates/`, the Rust library
/// and Cargo's registry.
pub fn is_runtime(file: &str, name: &str) -> bool {
    name.contains("::")
        || name.starts_with("fastinst_")
        || name.starts_with("_ZN")
        || [
            "/crates/",
            "/rustc/",
            "/.cargo/registry/",
            "/rust/deps/",
            "/library/core/",
            "/library/std/",
        ]
        .iter()
        .any(|d| file.contains(d))
}

/// Whether `name` is one of the C library's leaf functions the runtime
/// calls that run no code of the caller's: string and memory functions
/// (`__memcpy_avx_unaligned_erms`, `strlen`), the allocator, and the
/// dynamic loader's thread-local lookup. Valgrind's suffixes (`'2`, a
/// recursion level) and symbol versions (`@GLIBC_2.2.5`) are ignored.
pub fn is_leaf_library_function(name: &str) -> bool {
    const ALLOCATOR: [&str; 14] = [
        "malloc",
        "calloc",
        "realloc",
        "reallocarray",
        "free",
        "posix_memalign",
        "aligned_alloc",
        "memalign",
        "valloc",
        "libc_malloc",
        "libc_calloc",
        "libc_realloc",
        "libc_free",
        "libc_memalign",
    ];
    let base = name.split(['@', '\'']).next().unwrap_or(name).trim_start_matches('_');
    base.starts_with("mem") || base.starts_with("str") || base == "tls_get_addr" || ALLOCATOR.contains(&base)
}

/// Whether the object file at `path` is the C library or the dynamic
/// loader (`libc.so.6`, `ld-linux-x86-64.so.2`). The program's own
/// functions may carry such names (QuickJS's `string_buffer_*`), and the
/// runtime's return trampolines show in callgrind as calls from the
/// runtime into them.
pub fn is_c_library_object(path: &str) -> bool {
    let file = path.rsplit('/').next().unwrap_or(path);
    ["libc.so", "libc-", "ld-linux", "ld-"]
        .iter()
        .any(|p| file.starts_with(p))
}

/// One of callgrind's compressed names (`(7) name` defines 7, `(7)` uses
/// it) or a plain name.
fn expand(spec: &str, table: &mut Vec<String>) -> Result<String> {
    let spec = spec.trim();
    let Some(rest) = spec.strip_prefix('(') else {
        return Ok(spec.to_string());
    };
    let bad = || EvalError::Tool(format!("callgrind output: bad name `{spec}`"));
    let (id, name) = rest.split_once(')').ok_or_else(bad)?;
    let id: usize = id.parse().map_err(|_| bad())?;
    let name = name.trim();
    if !name.is_empty() {
        if table.len() <= id {
            table.resize(id + 1, String::new());
        }
        table[id] = name.to_string();
    }
    table.get(id).filter(|n| !n.is_empty()).cloned().ok_or_else(bad)
}

/// Reads a callgrind output file's text (Valgrind 3.x, run with
/// `--cache-sim=yes`) and sums it by side: each function's own counts to
/// the program's or the runtime's side ([`is_runtime`]), and the inclusive
/// counts of the runtime's calls into the C library's leaf functions
/// ([`is_leaf_library_function`]) to [`Sides::runtime_calls`].
///
/// The format: `events:` names the columns and `positions:` how many
/// position columns lead each cost line (each a number, `+n`, `-n` or
/// `*`); `fl=` and `fn=` open a function's lines (`fi=`/`fe=` switch the
/// source file of inlined lines, not the function); `cfn=` (with `cob=`,
/// `cfi=`/`cfl=`) names a callee and `calls=` says that the next cost
/// line is a call's inclusive cost, not the caller's own; `jump=` and
/// `jcnd=` lines are followed by a line of positions only. Counts left off
/// at the end of a line are 0.
pub fn parse(text: &str) -> Result<Sides> {
    let bad = |why: String| EvalError::Tool(format!("callgrind output: {why}"));
    let mut columns: Option<[Option<usize>; 9]> = None;
    const NAMES: [&str; 9] = ["Ir", "I1mr", "ILmr", "Dr", "D1mr", "DLmr", "Dw", "D1mw", "DLmw"];
    let mut positions = 1usize;
    let (mut files, mut fns, mut objects) = (Vec::new(), Vec::new(), Vec::new());
    let mut file = String::new();
    let mut runtime = false;
    let mut callee: Option<String> = None;
    let mut callee_file: Option<String> = None;
    let mut object = String::new();
    let mut callee_object: Option<String> = None;
    // What the next cost line is: the current function's own, a call's
    // inclusive cost, or positions only.
    enum Next {
        Own,
        Call,
        Skip,
    }
    let mut next = Next::Own;
    let mut sides = Sides::default();
    let mut lines = 0usize;
    for (n, line) in text.lines().enumerate() {
        let line = line.trim_end();
        if let Some(ev) = line.strip_prefix("events:") {
            let ev: Vec<&str> = ev.split_whitespace().collect();
            columns = Some(NAMES.map(|name| ev.iter().position(|e| *e == name)));
        } else if let Some(p) = line.strip_prefix("positions:") {
            positions = p.split_whitespace().count().max(1);
        } else if let Some(f) = line.strip_prefix("fl=") {
            file = expand(f, &mut files)?;
        } else if let Some(f) = line.strip_prefix("fi=").or_else(|| line.strip_prefix("fe=")) {
            expand(f, &mut files)?;
        } else if let Some(f) = line.strip_prefix("fn=") {
            runtime = is_runtime(&file, &expand(f, &mut fns)?);
            (callee, callee_file, callee_object) = (None, None, None);
        } else if let Some(o) = line.strip_prefix("ob=") {
            object = expand(o, &mut objects)?;
        } else if let Some(o) = line.strip_prefix("cob=") {
            callee_object = Some(expand(o, &mut objects)?);
        } else if let Some(f) = line.strip_prefix("cfi=").or_else(|| line.strip_prefix("cfl=")) {
            callee_file = Some(expand(f, &mut files)?);
        } else if let Some(f) = line.strip_prefix("cfn=") {
            callee = Some(expand(f, &mut fns)?);
        } else if line.starts_with("calls=") {
            next = Next::Call;
        } else if line.starts_with("jump=") || line.starts_with("jcnd=") {
            next = Next::Skip;
        } else if line.starts_with(|c: char| c.is_ascii_digit() || c == '+' || c == '-' || c == '*') {
            let kind = std::mem::replace(&mut next, Next::Own);
            if let Next::Skip = kind {
                continue;
            }
            let cols = columns.ok_or_else(|| bad(format!("line {}: counts before `events:`", n + 1)))?;
            let values: Vec<u64> = line
                .split_whitespace()
                .skip(positions)
                .map(|v| v.parse::<u64>())
                .collect::<std::result::Result<_, _>>()
                .map_err(|_| bad(format!("line {}: `{line}` is not counts", n + 1)))?;
            let get = |k: usize| cols[k].and_then(|i| values.get(i)).copied().unwrap_or(0);
            let c = Counts {
                instructions: get(0),
                l1_misses: get(1) + get(4) + get(7),
                ll_misses: get(2) + get(5) + get(8),
            };
            match kind {
                Next::Call => {
                    let to = callee.as_deref().unwrap_or("");
                    let to_file = callee_file.take().unwrap_or_else(|| file.clone());
                    let to_object = callee_object.take().unwrap_or_else(|| object.clone());
                    if runtime
                        && !is_runtime(&to_file, to)
                        && is_c_library_object(&to_object)
                        && is_leaf_library_function(to)
                    {
                        sides.runtime_calls = sides.runtime_calls + c;
                    }
                }
                _ => {
                    let side = if runtime {
                        &mut sides.runtime
                    } else {
                        &mut sides.program
                    };
                    *side = *side + c;
                    lines += 1;
                }
            }
        }
    }
    match columns {
        None => Err(bad("no `events:` line".into())),
        Some(c) if c[0].is_none() || c[1].is_none() || c[2].is_none() => Err(bad(
            "the events hold no cache simulation (Ir, I1mr, ILmr): run with --cache-sim=yes".into(),
        )),
        Some(_) if lines == 0 => Err(bad("no counts".into())),
        Some(_) => Ok(sides),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Callgrind's format as Valgrind 3.19 writes it: compressed names,
    /// relative positions, calls with their inclusive costs.
    const OUT: &str = "\
# callgrind format
version: 1
creator: callgrind-3.19.0
positions: line
events: Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw
summary: 1485 0 0 13 22 8 1 3 4

ob=(1) /w/bin/quickjs
fl=(1) ???
fn=(1) JS_CallInternal
0 1000 400 300 10 20 5 1 2 3
cob=(2) /w/target/release/libfastinst.so
cfl=(2) /w/crates/fastinst/src/profile/mod.rs
cfn=(2) fastinst::profile::on_exit
calls=3 12
+4 90 0 0 2 2 1 1 1 1

ob=(2)
fl=(2)
fn=(2)
12 50 20 10 1 2 1 0 1 1
cob=(3) /usr/lib/x86_64-linux-gnu/libc.so.6
cfl=(3) ./malloc/./malloc/malloc.c
cfn=(3) malloc
calls=1 7
+1 40 0 0 1 0 0 0 0 0
cob=(3)
cfl=(4) ./elf/dl-iteratephdr.c
cfn=(4) dl_iterate_phdr
calls=1 0
* 30 0 0 0 0 0 0 0 0
cob=(1)
cfl=(1)
cfn=(7) string_buffer_putc'2
calls=1 0
* 70 0 0 3 0 0 0 0 0

ob=(3)
fl=(3)
fn=(3)
7 200 0 0 2
fl=(4)
fn=(4)
0 5
fl=(1)
fn=(5) fastinst_sled_enter_avx
0 30 10 10 0 0 2 0 0 0
fn=(6) ???
-2 5
fe=(3)
+1 3
";

    #[test]
    fn sums_by_side_with_missing_counts_as_zero() {
        let s = parse(OUT).unwrap();
        assert_eq!(
            s.program,
            Counts {
                instructions: 1000 + 200 + 5 + 5 + 3,
                l1_misses: 10 + 20 + 5 + 2,
                ll_misses: 1 + 2 + 3,
            }
        );
        assert_eq!(
            s.runtime,
            Counts {
                instructions: 50 + 30,
                l1_misses: 1 + 2 + 1 + 2,
                ll_misses: 1 + 1,
            }
        );
    }

    /// The runtime's call of `malloc` is counted as the runtime's; its
    /// call of `dl_iterate_phdr` (which calls back), its return trampoline
    /// seen as a call of a program function named like a string function,
    /// and the program's call of the runtime are not.
    #[test]
    fn the_runtimes_calls_of_leaf_library_functions_are_told_apart() {
        let s = parse(OUT).unwrap();
        let malloc = Counts {
            instructions: 40,
            l1_misses: 1,
            ll_misses: 0,
        };
        assert_eq!(s.runtime_calls, malloc);
        assert_eq!(s.program_own().instructions, s.program.instructions - 40);
        assert_eq!(s.program_own().l1_misses, s.program.l1_misses - 1);
    }

    #[test]
    fn leaf_library_functions_are_named_as_the_c_library_names_them() {
        for f in [
            "__memcpy_avx_unaligned_erms",
            "__memcmp_avx2_movbe",
            "memcpy@GLIBC_2.2.5",
            "__strlen_avx2",
            "malloc",
            "free'2",
            "posix_memalign",
            "__tls_get_addr",
        ] {
            assert!(is_leaf_library_function(f), "{f}");
        }
        for f in ["dl_iterate_phdr", "qsort", "pthread_create", "write", "JS_CallInternal"] {
            assert!(!is_leaf_library_function(f), "{f}");
        }
        for o in [
            "/usr/lib/x86_64-linux-gnu/libc.so.6",
            "/lib64/ld-linux-x86-64.so.2",
            "libc-2.31.so",
        ] {
            assert!(is_c_library_object(o), "{o}");
        }
        for o in [
            "/w/bin/quickjs",
            "/w/target/release/libfastinst.so",
            "/usr/lib/libcrypto.so.3",
            "???",
        ] {
            assert!(!is_c_library_object(o), "{o}");
        }
    }

    #[test]
    fn columns_follow_the_events_line() {
        let s = parse("events: Dr Ir I1mr ILmr\nfn=main\n1 7 100 3 1\n").unwrap();
        assert_eq!(
            s.program,
            Counts {
                instructions: 100,
                l1_misses: 3,
                ll_misses: 1
            }
        );
        // Two position columns (an address and a line) before the counts.
        let s = parse("positions: instr line\nevents: Ir I1mr ILmr\nfn=main\n0x10 1 100 3 1\n").unwrap();
        assert_eq!((s.program.instructions, s.program.l1_misses), (100, 3));
    }

    #[test]
    fn output_without_the_cache_simulation_or_counts_is_refused() {
        let e = parse("events: Ir\nfn=main\n1 100\n").unwrap_err().to_string();
        assert!(e.contains("--cache-sim=yes"), "{e}");
        assert!(parse("fn=main\n1 100\n").is_err());
        assert!(parse("events: Ir I1mr ILmr\nfn=main\n1 x\n").is_err());
        assert!(parse("events: Ir I1mr ILmr\n").is_err());
        assert!(
            parse("events: Ir I1mr ILmr\nfn=(3)\n1 1 1 1\n").is_err(),
            "an undefined name"
        );
    }

    #[test]
    fn runtime_code_is_told_from_c_code() {
        assert!(is_runtime("???", "fastinst::profile::handlers::on_entry"));
        assert!(is_runtime("???", "<alloc::vec::Vec<T> as core::ops::Drop>::drop"));
        assert!(is_runtime(
            "/rust/deps/hashbrown-0.16.1/src/raw/mod.rs",
            "reserve_rehash"
        ));
        assert!(is_runtime("???", "fastinst_sled_return_avx"));
        assert!(!is_runtime("???", "JS_CallInternal"));
        assert!(!is_runtime(
            "./string/../sysdeps/x86_64/multiarch/memmove-vec-unaligned-erms.S",
            "__memcpy_avx_unaligned_erms"
        ));
        assert!(!is_runtime("???", "???"));
    }

    #[test]
    fn the_estimate_weighs_misses() {
        let a = Counts {
            instructions: 1000,
            l1_misses: 10,
            ll_misses: 1,
        };
        assert_eq!(a.cycles(), 1000.0 + 100.0 + 100.0);
        let b = Counts {
            instructions: 1012,
            l1_misses: 9,
            ll_misses: 2,
        };
        let d = b - a;
        assert_eq!(d.cycles(), 12.0 - 10.0 + 100.0);
        assert!((d.pct_of(&a) - 100.0 * 102.0 / 1200.0).abs() < 1e-9);
    }
}
