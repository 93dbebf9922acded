//! The hook path allocates nothing: a probe switched on with a handler is
//! called through the `-finstrument-functions` entry and exit hooks many
//! times while this thread's allocations are counted. Discovery, which may
//! allocate, runs before counting starts. A test binary of its own: its
//! allocator counts.

mod support;

use fastinst::{ProbeId, ProbeKind};
use std::sync::atomic::{AtomicU64, Ordering};
use support::instrumented;
use testkit::alloc::{allocations_in, Counting};

#[global_allocator]
static ALLOC: Counting = Counting;

static ENTRIES: AtomicU64 = AtomicU64::new(0);
static EXITS: AtomicU64 = AtomicU64::new(0);

extern "C" fn on_entry(_: ProbeId) {
    ENTRIES.fetch_add(1, Ordering::Relaxed);
}

extern "C" fn on_exit(_: ProbeId) {
    EXITS.fetch_add(1, Ordering::Relaxed);
}

#[test]
fn hook_calls_and_their_handlers_allocate_nothing() {
    // The counter counts: a control that allocates reads as it should.
    assert_eq!(allocations_in(|| drop(std::hint::black_box(Box::new(7u64)))), 1);

    fastinst::on_discovery(|m| {
        let h = if m.kind == ProbeKind::Entry { on_entry } else { on_exit };
        fastinst::activate(m.id, h).expect("activate");
    })
    .unwrap();
    // Discovery of both probes, the thread's first hook.
    instrumented(3);
    assert_eq!(fastinst::probe_count(), 2, "the entry and exit probes were discovered");
    let (e0, x0) = (ENTRIES.load(Ordering::Relaxed), EXITS.load(Ordering::Relaxed));
    const CALLS: u64 = 20_000;
    let n = allocations_in(|| {
        for _ in 0..CALLS {
            instrumented(3);
        }
    });
    assert_eq!(
        ENTRIES.load(Ordering::Relaxed) - e0,
        CALLS,
        "every entry reached its handler"
    );
    assert_eq!(
        EXITS.load(Ordering::Relaxed) - x0,
        CALLS,
        "every exit reached its handler"
    );
    assert_eq!(n, 0, "allocations on the hook path in {CALLS} calls");
}
