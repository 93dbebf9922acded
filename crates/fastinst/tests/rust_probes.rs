//! Rust code as a target, driven by the Rust API in its own process (the
//! runtime linked in, no preload library): `#[fastinst::instrument]` on
//! free, recursive, generic and panicking functions and on methods of a
//! generic impl, and `fastinst::probe!` points, registered with
//! `fastinst::register_sleds`. Exact entry, exit and point counts; a panic
//! unwinding through a function whose exit is watched; then 8 threads
//! (more than CI's CPUs) checking their results while the main thread
//! toggles every probe. A test binary of its own: the probes it patches are
//! process-wide.

use fastinst::{ProbeId, ProbeKind};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

const MAX: usize = 1 << 12;
static HITS: [AtomicU64; MAX] = [const { AtomicU64::new(0) }; MAX];

extern "C" fn count(id: ProbeId) {
    HITS[id.get() as usize % MAX].fetch_add(1, Ordering::Relaxed);
}

#[fastinst::instrument]
fn leaf(x: u64) -> u64 {
    fastinst::probe!("leaf-point");
    x.wrapping_mul(3).wrapping_add(1)
}

#[fastinst::instrument]
fn fib(n: u32) -> u64 {
    if n < 2 {
        n as u64
    } else {
        fib(n - 1) + fib(n - 2)
    }
}

#[fastinst::instrument]
fn may_panic(x: u64) -> u64 {
    if x == 13 {
        panic!("unlucky {x}");
    }
    leaf(x)
}

#[fastinst::instrument]
fn wide(a: f64, b: (u8, u16), c: &str, d: impl Into<u64>, e: [u64; 4]) -> (f64, String) {
    (
        a * 2.0 + b.0 as f64 + b.1 as f64,
        format!("{c}{}", d.into() + e.iter().sum::<u64>()),
    )
}

struct Acc<T> {
    total: u64,
    last: Option<T>,
}

impl<T: Copy + Into<u64>> Acc<T> {
    #[fastinst::instrument]
    fn new() -> Self {
        Acc { total: 0, last: None }
    }

    #[fastinst::instrument]
    fn add(&mut self, v: T) -> u64 {
        self.total += v.into();
        self.last = Some(v);
        self.total
    }
}

/// Hits per probe name and kind since the last call.
fn hits() -> HashMap<(String, ProbeKind), u64> {
    let mut out = HashMap::new();
    for m in fastinst::probes() {
        *out.entry((m.name().into_owned(), m.kind)).or_default() +=
            HITS[m.id.get() as usize % MAX].swap(0, Ordering::Relaxed);
    }
    out
}

fn get(h: &HashMap<(String, ProbeKind), u64>, name: &str, kind: ProbeKind) -> u64 {
    *h.get(&(name.to_string(), kind))
        .unwrap_or_else(|| panic!("no {kind:?} probe for {name}: {h:?}"))
}

fn work(round: u64) -> u64 {
    let mut s = 0;
    for i in 0..100 {
        s += leaf(i + round);
    }
    s += fib(10);
    let mut a = Acc::<u8>::new();
    a.add(3);
    let mut b = Acc::<u32>::new();
    b.add(4);
    b.add(5);
    let (f, t) = wide(1.5, (2, 3), "x", 7u8, [1, 2, 3, 4]);
    assert_eq!((f, t.as_str()), (8.0, "x17"));
    s + a.total + b.total
}

#[test]
fn rust_probes_count_exactly_survive_panics_and_toggling_threads() {
    let r = fastinst::register_sleds();
    assert!(r.functions >= 8 && r.points >= 1, "{r:?}");
    assert!(r.skipped.is_empty(), "{r:?}");
    let names: Vec<String> = fastinst::probes().map(|m| m.name().into_owned()).collect();
    for f in [
        "rust_probes::leaf",
        "rust_probes::fib",
        "rust_probes::Acc<T>::add",
        "rust_probes::Acc<T>::new",
        "leaf-point",
    ] {
        assert!(names.iter().any(|n| n == f), "{f} in {names:?}");
    }
    assert!(!names.iter().any(|n| n.contains("__fastinst_")), "{names:?}");
    let want = work(0);

    // Every probe on: exact counts.
    for m in fastinst::probes() {
        fastinst::activate(m.id, count).unwrap();
    }
    assert_eq!(work(0), want);
    let h = hits();
    for kind in [ProbeKind::Entry, ProbeKind::Exit] {
        assert_eq!(get(&h, "rust_probes::leaf", kind), 100, "{kind:?}");
        assert_eq!(
            get(&h, "rust_probes::fib", kind),
            177,
            "{kind:?}: fib(10) makes 177 calls"
        );
        // Two instances each (u8 and u32), one name (legacy symbols do not
        // spell the type).
        assert_eq!(get(&h, "rust_probes::Acc<T>::add", kind), 3, "{kind:?}");
        assert_eq!(get(&h, "rust_probes::Acc<T>::new", kind), 2, "{kind:?}");
        assert_eq!(get(&h, "rust_probes::wide", kind), 1, "{kind:?}");
    }
    assert_eq!(get(&h, "leaf-point", ProbeKind::Point), 100);

    // A panic through a function whose exit is watched: the unwinder finds
    // the real return address, the catch works, the next calls count.
    let caught = std::panic::catch_unwind(|| may_panic(13));
    assert!(caught.is_err());
    assert_eq!(may_panic(2), 7);
    let h = hits();
    assert_eq!(get(&h, "rust_probes::may_panic", ProbeKind::Entry), 2);
    assert_eq!(
        get(&h, "rust_probes::may_panic", ProbeKind::Exit),
        1,
        "the panicking call never returned"
    );

    // Every probe off: nothing counts.
    for m in fastinst::probes() {
        fastinst::deactivate(m.id).unwrap();
    }
    assert_eq!(work(1), want + 300);
    assert!(hits().values().all(|&n| n == 0));

    // 8 threads checking results while every probe toggles.
    let stop = AtomicBool::new(false);
    let ids: Vec<ProbeId> = fastinst::probes().map(|m| m.id).collect();
    let mut toggles = 0u64;
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..8u64)
            .map(|k| {
                let stop = &stop;
                s.spawn(move || {
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        assert_eq!(work(k), want + 300 * k, "thread {k} round {n}");
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        let end = std::time::Instant::now() + std::time::Duration::from_millis(300);
        while std::time::Instant::now() < end {
            for &id in &ids {
                fastinst::activate(id, count).unwrap();
            }
            for (i, &id) in ids.iter().enumerate() {
                if !(toggles as usize / ids.len() + i).is_multiple_of(3) {
                    fastinst::deactivate(id).unwrap();
                }
            }
            toggles += 2 * ids.len() as u64;
        }
        stop.store(true, Ordering::Relaxed);
        let rounds: u64 = workers.into_iter().map(|w| w.join().unwrap()).sum();
        assert!(rounds > 8, "{rounds} rounds");
    });
    assert!(toggles > 1000, "{toggles} toggles");
    println!("0 failures in {toggles} toggles");
}
