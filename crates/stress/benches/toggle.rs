//! criterion benches of every toggle operation, measured in TSC ticks (a
//! custom criterion `Measurement`), for each mode and split. The harness
//! `fastinst-stress bench` prints the same operations as median/p90 beside a
//! same-run baseline; this bench adds criterion's statistics and history.

// `criterion_group!` makes a public function it cannot document.
#![allow(missing_docs)]

use callpatch::Form;
use criterion::{criterion_group, criterion_main, BenchmarkGroup, BenchmarkId, Criterion};
use stress::ticks::Ticks;
use stress::{Fixture, Method, Toggler};
use wordpatch::Wait;

/// One benchmark: toggles of a fresh site, left active afterwards.
fn bench_site(g: &mut BenchmarkGroup<'_, Ticks>, strategy: Method, form: Form, split: usize, name: &str) {
    let fx = Fixture::new(form, split).expect("fixture");
    let t = Toggler::new(&fx, strategy).expect("toggler");
    let mut on = false;
    g.bench_function(BenchmarkId::new(name, split), |b| {
        b.iter(|| {
            on = !on;
            t.set(on).expect("toggle");
        })
    });
    t.ensure_on().expect("restore");
}

fn toggles(c: &mut Criterion<Ticks>) {
    let forms = [
        ("call", Form::CallRel32),
        ("ind", Form::CallRipIndirect),
        ("jmp", Form::JmpRel32),
    ];
    for (strategy, name) in [
        (Method::CallFlip, "callpatch-flip"),
        (Method::CallPaper, "callpatch-paper"),
    ] {
        let mut g = c.benchmark_group(name);
        for (fname, form) in forms {
            for split in 0..form.len() {
                bench_site(&mut g, strategy, form, split, fname);
            }
        }
        g.finish();
    }
    let tmax = wordpatch::default_tmax();
    for (strategy, name) in [
        (Method::WordSync(Wait::Tmax(tmax)), "wordpatch-sync-tmax"),
        (Method::WordSync(Wait::SyncCore), "wordpatch-sync-synccore"),
        (Method::WordAsync(Wait::Tmax(tmax)), "wordpatch-async-tmax"),
    ] {
        let mut g = c.benchmark_group(name);
        g.sample_size(20);
        for split in 0..5 {
            bench_site(&mut g, strategy, Form::CallRel32, split, "call");
        }
        g.finish();
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().with_measurement(Ticks).warm_up_time(std::time::Duration::from_millis(300)).measurement_time(std::time::Duration::from_secs(1));
    targets = toggles
}
criterion_main!(benches);
