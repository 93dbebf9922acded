//! TSC ticks as a criterion [`Measurement`], so criterion's benches report
//! in the same unit as the harnesses (and the paper). Throughput in
//! elements divides by the element count: ticks per operation.

use criterion::measurement::{Measurement, ValueFormatter};
use criterion::Throughput;
use wordpatch::tsc;

/// TSC ticks as criterion's unit of measurement.
pub struct Ticks;

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
