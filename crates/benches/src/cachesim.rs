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
//! runs each program under Valgrind's cachegrind (plain build, the build
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
//! runtime's ([`is_runtime`]), so C library code called by the runtime
//! (the reports' `memcpy`, `write`) is charged to the program; that can
//! only make the indirect cost look larger than it is.

use crate::error::{EvalError, Result};
use std::ops::{Add, Sub};

/// Cachegrind's counts for some code.
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

/// Reads a cachegrind output file's text (format of Valgrind 3.x:
/// `events:` names the columns, `fl=` and `fn=` open a function's lines,
/// each line `LINE COUNT...` with counts left off at the end meaning 0)
/// and sums it by side.
pub fn parse(text: &str) -> Result<Sides> {
    let bad = |why: String| EvalError::Tool(format!("cachegrind output: {why}"));
    let mut columns: Option<[Option<usize>; 9]> = None;
    const NAMES: [&str; 9] = ["Ir", "I1mr", "ILmr", "Dr", "D1mr", "DLmr", "Dw", "D1mw", "DLmw"];
    let mut file = String::new();
    let mut runtime = false;
    let mut sides = Sides::default();
    let mut lines = 0usize;
    for (n, line) in text.lines().enumerate() {
        if let Some(ev) = line.strip_prefix("events:") {
            let ev: Vec<&str> = ev.split_whitespace().collect();
            columns = Some(NAMES.map(|name| ev.iter().position(|e| *e == name)));
        } else if let Some(f) = line.strip_prefix("fl=") {
            file = f.trim().to_string();
        } else if let Some(f) = line.strip_prefix("fn=") {
            runtime = is_runtime(&file, f.trim());
        } else if line.starts_with(|c: char| c.is_ascii_digit()) {
            let cols = columns.ok_or_else(|| bad(format!("line {}: counts before `events:`", n + 1)))?;
            let values: Vec<u64> = line
                .split_whitespace()
                .skip(1)
                .map(|v| v.parse::<u64>())
                .collect::<std::result::Result<_, _>>()
                .map_err(|_| bad(format!("line {}: `{line}` is not counts", n + 1)))?;
            let get = |k: usize| cols[k].and_then(|i| values.get(i)).copied().unwrap_or(0);
            let c = Counts {
                instructions: get(0),
                l1_misses: get(1) + get(4) + get(7),
                ll_misses: get(2) + get(5) + get(8),
            };
            let side = if runtime {
                &mut sides.runtime
            } else {
                &mut sides.program
            };
            *side = *side + c;
            lines += 1;
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

    const OUT: &str = "\
desc: I1 cache:         32768 B, 64 B, 8-way associative
cmd: ./quickjs workload.js
events: Ir I1mr ILmr Dr D1mr DLmr Dw D1mw DLmw
fl=???
fn=JS_CallInternal
0 1000 10 1 400 20 2 300 5 3
fl=/work/main/crates/fastinst/src/profile/mod.rs
fn=fastinst::profile::on_exit
12 50 1 0 20 2 1 10 1 1
fl=./malloc/./malloc/malloc.c
fn=malloc
7 200 2
fl=???
fn=fastinst_sled_enter_avx
0 30 0 0 10 0 0 10 2 0
fl=???
fn=???
0 5
summary: 1285 13 1 430 22 3 320 8 4
";

    #[test]
    fn sums_by_side_with_missing_counts_as_zero() {
        let s = parse(OUT).unwrap();
        assert_eq!(
            s.program,
            Counts {
                instructions: 1000 + 200 + 5,
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
    }

    #[test]
    fn output_without_the_cache_simulation_or_counts_is_refused() {
        let e = parse("events: Ir\nfn=main\n1 100\n").unwrap_err().to_string();
        assert!(e.contains("--cache-sim=yes"), "{e}");
        assert!(parse("fn=main\n1 100\n").is_err());
        assert!(parse("events: Ir I1mr ILmr\nfn=main\n1 x\n").is_err());
        assert!(parse("events: Ir I1mr ILmr\n").is_err());
    }

    #[test]
    fn runtime_code_is_told_from_c_code() {
        assert!(is_runtime("???", "fastinst::profile::on_entry"));
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
