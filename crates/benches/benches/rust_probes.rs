//! What a probe in Rust code costs while it is off, side by side in one
//! run: a `#[fastinst::instrument]` function and a `fastinst::probe!`
//! point against a disabled `tracing` event and `#[tracing::instrument]`
//! span (no subscriber: compiled in, switched off) and a `static-keys`
//! branch left off, each beside the same function plain. Then what
//! switching costs: a fastinst probe on and off against a static key
//! enabled and disabled (which its crate allows only while no other thread
//! runs), and the fastinst probes' cost while on with an empty handler.
//!
//! TSC ticks per call (or per switch): median and p90 over rounds, and the
//! extra ticks over the plain function measured in the same run.
//! `cargo bench -p fastinst-benches --bench rust_probes`; results in
//! `crates/benches/results/rust-probes.md`.

#![allow(missing_docs)]

use std::hint::black_box;

const CALLS: u64 = 20_000;
const ROUNDS: usize = 301;

static_keys::define_static_key_false!(KEY);

#[inline(never)]
fn plain(x: u64) -> u64 {
    x.wrapping_mul(0x9E37_79B9) ^ (x >> 7)
}

#[fastinst::instrument]
fn instrumented(x: u64) -> u64 {
    x.wrapping_mul(0x9E37_79B9) ^ (x >> 7)
}

#[inline(never)]
fn point(x: u64) -> u64 {
    fastinst::probe!("bench-point");
    x.wrapping_mul(0x9E37_79B9) ^ (x >> 7)
}

#[inline(never)]
fn tracing_event(x: u64) -> u64 {
    tracing::trace!(x, "called");
    x.wrapping_mul(0x9E37_79B9) ^ (x >> 7)
}

#[inline(never)]
#[tracing::instrument(level = "trace")]
fn tracing_span(x: u64) -> u64 {
    x.wrapping_mul(0x9E37_79B9) ^ (x >> 7)
}

#[inline(never)]
fn static_key(x: u64) -> u64 {
    if static_keys::static_branch_unlikely!(KEY) {
        black_box(x);
    }
    x.wrapping_mul(0x9E37_79B9) ^ (x >> 7)
}

fn now() -> u64 {
    wordpatch::tsc::now()
}

/// Ticks per call of `f` over [`CALLS`] direct calls, one sample a round.
macro_rules! per_call {
    ($f:ident) => {{
        #[inline(never)]
        fn run() -> f64 {
            let t0 = now();
            let mut acc = 0u64;
            for i in 0..CALLS {
                acc = acc.wrapping_add($f(black_box(i)));
            }
            black_box(acc);
            (now() - t0) as f64 / CALLS as f64
        }
        run
    }};
}

/// Ticks per call of `f` where each call takes the previous one's result:
/// the calls' latency, which independent calls overlap.
macro_rules! per_chained_call {
    ($f:ident) => {{
        #[inline(never)]
        fn run() -> f64 {
            let t0 = now();
            let mut acc = 1u64;
            for _ in 0..CALLS {
                acc = $f(acc);
            }
            black_box(acc);
            (now() - t0) as f64 / CALLS as f64
        }
        run
    }};
}

/// A case: its name, and one round of it (ticks per call).
type Case<'a> = (&'a str, fn() -> f64);

fn quantile(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q).round() as usize]
}

/// Median and p90 of `ROUNDS` samples of each case, rounds interleaved
/// so that every case sees the same machine.
fn measure(cases: &[Case]) -> Vec<(f64, f64)> {
    let mut samples = vec![Vec::with_capacity(ROUNDS); cases.len()];
    for _ in 0..ROUNDS {
        for (k, (_, f)) in cases.iter().enumerate() {
            samples[k].push(f());
        }
    }
    samples
        .iter_mut()
        .map(|s| (quantile(s, 0.5), quantile(s, 0.9)))
        .collect()
}

fn print_table(title: &str, cases: &[Case], r: &[(f64, f64)]) {
    println!("{title}\n");
    println!("| case | median | p90 | over plain (median) |");
    println!("|---|---|---|---|");
    let base = r[0].0;
    for ((name, _), (m, p)) in cases.iter().zip(r) {
        println!("| {name} | {m:.2} | {p:.2} | {:+.2} |", m - base);
    }
    println!();
}

extern "C" fn empty(_: fastinst::ProbeId) {}

/// Ticks per enable-and-disable pair of the static key, one sample each.
fn static_key_switches(n: usize) -> Vec<f64> {
    (0..n)
        .map(|_| {
            let t0 = now();
            // SAFETY: no other thread runs in this process, and
            // global_init ran, as the crate requires.
            unsafe {
                KEY.enable();
                KEY.disable();
            }
            (now() - t0) as f64
        })
        .collect()
}

fn main() {
    static_keys::global_init();
    // Before fastinst makes its code pages writable: static-keys puts a
    // page back to read+execute after each switch, and fastinst's next
    // write there would take a fault (resolved by wordpatch's handler, at
    // the cost of a signal and an `mprotect` that are not the toggle's).
    const SWITCHES: usize = 2001;
    let mut sk = static_key_switches(SWITCHES);
    let report = fastinst::register_sleds();
    assert!(report.functions >= 1 && report.points >= 1, "{report:?}");
    let probes: Vec<fastinst::ProbeMeta> = fastinst::probes()
        .filter(|m| m.name().ends_with("::instrumented") || m.name() == "bench-point")
        .collect();
    assert_eq!(probes.len(), 3, "the instrumented function's entry and exit, the point");
    let off: [Case; 6] = [
        ("plain function (baseline)", per_call!(plain)),
        ("fastinst #[instrument], off", per_call!(instrumented)),
        ("fastinst probe! point, off", per_call!(point)),
        ("tracing trace! event, no subscriber", per_call!(tracing_event)),
        ("#[tracing::instrument] span, no subscriber", per_call!(tracing_span)),
        ("static-keys branch, off", per_call!(static_key)),
    ];
    for _ in 0..3 {
        measure(&off);
    }
    println!("{} calls a round, {} rounds, TSC ticks per call\n", CALLS, ROUNDS);
    print_table("Off, independent calls (throughput):", &off, &measure(&off));
    let chained: [Case; 6] = [
        (off[0].0, per_chained_call!(plain)),
        (off[1].0, per_chained_call!(instrumented)),
        (off[2].0, per_chained_call!(point)),
        (off[3].0, per_chained_call!(tracing_event)),
        (off[4].0, per_chained_call!(tracing_span)),
        (off[5].0, per_chained_call!(static_key)),
    ];
    print_table(
        "Off, each call on the previous one's result (latency):",
        &chained,
        &measure(&chained),
    );

    // On, with an empty handler: the fastinst probes' cost when used.
    for m in &probes {
        fastinst::activate(m.id, empty).expect("activate");
    }
    let on: [Case; 3] = [
        ("plain function (baseline)", per_call!(plain)),
        ("fastinst #[instrument], entry and exit on", per_call!(instrumented)),
        ("fastinst probe! point, on", per_call!(point)),
    ];
    measure(&on);
    print_table("On, with an empty handler:", &on, &measure(&on));
    for m in &probes {
        fastinst::deactivate(m.id).expect("deactivate");
    }

    // Switching: one on and one off, ticks per pair.
    let entry = probes
        .iter()
        .find(|m| m.kind == fastinst::ProbeKind::Entry)
        .expect("entry")
        .id;
    let mut fi: Vec<f64> = (0..SWITCHES)
        .map(|_| {
            let t0 = now();
            fastinst::activate(entry, empty).expect("activate");
            fastinst::deactivate(entry).expect("deactivate");
            (now() - t0) as f64
        })
        .collect();
    println!("Switching on then off ({SWITCHES} pairs), TSC ticks per pair:\n");
    println!("| case | median | p90 |");
    println!("|---|---|---|");
    let fi_m = quantile(&mut fi, 0.5);
    let sk_m = quantile(&mut sk, 0.5);
    println!(
        "| fastinst activate + deactivate (threads may run the code) | {fi_m:.0} | {:.0} |",
        quantile(&mut fi, 0.9)
    );
    println!(
        "| static-keys enable + disable (no other thread may run) | {sk_m:.0} | {:.0} |",
        quantile(&mut sk, 0.9)
    );
    println!("\nstatic-keys / fastinst switching, medians: {:.1}x", sk_m / fi_m);
    black_box(static_key(0) + tracing_span(0) + tracing_event(0));
}
