//! criterion benches of the paper's §8.5 in TSC ticks: one call of a
//! function whose only instruction before `ret` is a probe site, in each
//! off form (and active) at every straddle split, beside an empty loop.
//! `fastinst-eval --only inactive` prints the same cases as a table of
//! medians and p90s.

// `criterion_group!` makes a public function it cannot document.
#![allow(missing_docs)]

use callpatch::Form;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use stress::bench::{fixture_in_state, fixture_with_code};
use stress::ticks::Ticks;
use stress::Fixture;

/// Makes a fixture with its site in one form, at a split.
type Make<'a> = &'a dyn Fn(usize) -> Result<Fixture, String>;

fn inactive(c: &mut Criterion<Ticks>) {
    let mut g = c.benchmark_group("inactive-probe");
    g.throughput(Throughput::Elements(1));
    g.bench_function("empty-loop", |b| b.iter(|| std::hint::black_box(())));
    let forms: [(&str, Make); 6] = [
        ("nop5", &|k| fixture_in_state(Form::CallRel32, k, "nop")),
        ("flip-off", &|k| fixture_in_state(Form::CallRel32, k, "flip")),
        ("paper-off", &|k| fixture_in_state(Form::CallRel32, k, "paper")),
        ("sled-gcc-normalised", &|k| {
            fixture_with_code(Form::CallRel32, k, &providers::patchable::NORMALISED)
        }),
        ("sled-clang", &|k| {
            fixture_with_code(Form::CallRel32, k, &[0x0F, 0x1F, 0x44, 0x00, 0x08])
        }),
        ("active", &|k| fixture_in_state(Form::CallRel32, k, "active")),
    ];
    for (name, make) in forms {
        for split in 0..5 {
            let fx = make(split).expect("fixture");
            let f = fx.entry;
            g.bench_with_input(BenchmarkId::new(name, split), &split, |b, _| {
                b.iter(|| std::hint::black_box(f()))
            });
        }
    }
    g.finish();
}

fn ticks() -> Criterion<Ticks> {
    Criterion::default().with_measurement(Ticks)
}

criterion_group! {
    name = benches;
    config = ticks();
    targets = inactive
}
criterion_main!(benches);
