//! The latency profiler's handlers allocate nothing: its entry and exit
//! handlers (timing and counting epochs, windows opening and closing) and
//! its CPU-sample signal handler run on this thread for several epochs
//! while its allocations are counted. The sampler thread, which may
//! allocate, is not counted. A test binary of its own: its allocator
//! counts, and the profiler is process-wide.

mod support;

use std::time::{Duration, Instant};
use support::instrumented;
use testkit::alloc::{allocations_in, Counting};

#[global_allocator]
static ALLOC: Counting = Counting;

#[test]
fn the_profilers_handlers_allocate_nothing() {
    let out = std::env::temp_dir().join(format!("fastinst-noalloc-{}", std::process::id()));
    std::fs::create_dir_all(&out).unwrap();
    // Short epochs, so that the counted stretch spans many of them.
    std::env::set_var("FASTINST_PROFILE_EPOCH_MS", "2");
    fastinst::profile::install(out.clone()).unwrap();
    // Discovery, the thread's store, its clock: allocated before counting.
    for _ in 0..100 {
        instrumented(50);
    }
    assert_eq!(fastinst::probe_count(), 2);
    let clock = fastinst::clock::current().expect("the hooks registered this thread");
    let (hooks0, period0) = (clock.hooks(), fastinst::clock::period().0);
    let mut calls = 0u64;
    let n = allocations_in(|| {
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_millis(300) {
            instrumented(50);
            calls += 1;
        }
    });
    let (hooks, periods) = (clock.hooks() - hooks0, fastinst::clock::period().0 - period0);
    // The handlers ran: every hook clocks itself, and the epochs turned
    // over, their windows counting and timing, while the loop ran.
    assert!(hooks > 0, "no clocked hook in {calls} calls");
    assert!(periods >= 4, "{periods} epochs in the counted stretch");
    assert_eq!(
        n, 0,
        "allocations on this thread in {calls} profiled calls ({hooks} clocked hooks, {periods} epochs)"
    );
    std::fs::remove_dir_all(&out).ok();
}
