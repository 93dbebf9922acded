//! criterion benches of every toggle operation, measured in TSC ticks (a
//! custom criterion `Measurement`), for each mode and split. The harness
//! `fastinst-stress bench` prints the same operations as median/p90 beside a
//! same-run baseline; this bench adds criterion's statistics and history.

use callpatch::Form;
use criterion::measurement::{Measurement, ValueFormatter};
use criterion::{criterion_group, criterion_main, BenchmarkGroup, BenchmarkId, Criterion, Throughput};
use stress::{Fixture, Strategy, Toggler};
use wordpatch::{tsc, Wait};

/// TSC ticks as criterion's unit of measurement.
struct Ticks;

struct TickFormatter;

impl ValueFormatter for TickFormatter {
    fn scale_values(&self, _typical: f64, _values: &mut [f64]) -> &'static str {
        "ticks"
    }
    fn scale_throughputs(&self, _typical: f64, t: &Throughput, values: &mut [f64]) -> &'static str {
        if let Throughput::Elements(n) = t {
            for v in values.iter_mut() {
                *v /= *n as f64;
            }
        }
        "ticks/op"
    }
    fn scale_for_machines(&self, _values: &mut [f64]) -> &'static str {
        "ticks"
    }
}

impl Measurement for Ticks {
    type Intermediate = u64;
    type Value = u64;
    fn start(&self) -> u64 {
        tsc::now_ordered()
    }
    fn end(&self, i: u64) -> u64 {
        tsc::now_ordered() - i
    }
    fn add(&self, a: &u64, b: &u64) -> u64 {
        a + b
    }
    fn zero(&self) -> u64 {
        0
    }
    fn to_f64(&self, v: &u64) -> f64 {
        *v as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        &TickFormatter
    }
}

/// One benchmark: toggles of a fresh site, left active afterwards.
fn bench_site(g: &mut BenchmarkGroup<'_, Ticks>, strategy: Strategy, form: Form, split: usize, name: &str) {
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
        (Strategy::CallFlip, "callpatch-flip"),
        (Strategy::CallPaper, "callpatch-paper"),
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
        (Strategy::WordSync(Wait::Tmax(tmax)), "wordpatch-sync-tmax"),
        (Strategy::WordSync(Wait::SyncCore), "wordpatch-sync-synccore"),
        (Strategy::WordAsync(Wait::Tmax(tmax)), "wordpatch-async-tmax"),
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
