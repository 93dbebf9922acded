//! A Rust service instrumented with `#[fastinst::instrument]` and
//! `fastinst::probe!`, for `fastinst run`: worker threads (more than this
//! machine's CPUs, by default) serve requests from a shared queue, each
//! parsed, looked up in a cache (a miss is a point probe) and rendered in
//! a few parts. It prints what it did, which the exact count tool must
//! match.
//!
//! ```sh
//! cargo build --release -p fastinst-cli --example rust_service
//! fastinst run -- target/release/examples/rust_service      # the profile
//! fastinst run --tool count -- target/release/examples/rust_service
//! ```
//!
//! `rust_service [REQUESTS [THREADS]]` (default 200000 and 4).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

static MISSES: AtomicU64 = AtomicU64::new(0);
static PARTS: AtomicU64 = AtomicU64::new(0);

/// A request: a key and how many parts its answer has.
struct Request {
    key: u64,
    parts: u32,
}

#[fastinst::instrument]
fn parse(line: &str) -> Request {
    let mut it = line.split(' ');
    let key = it.next().and_then(|k| k.parse().ok()).unwrap_or(0);
    let parts = it.next().and_then(|p| p.parse().ok()).unwrap_or(1);
    Request { key, parts }
}

/// A cache of computed values, one lock per shard.
struct Cache {
    shards: Vec<Mutex<HashMap<u64, u64>>>,
}

impl Cache {
    #[fastinst::instrument]
    fn lookup(&self, key: u64) -> u64 {
        let mut shard = self.shards[(key % self.shards.len() as u64) as usize].lock().unwrap();
        if let Some(&v) = shard.get(&key) {
            return v;
        }
        fastinst::probe!("cache-miss");
        MISSES.fetch_add(1, Ordering::Relaxed);
        let v = expensive(key);
        shard.insert(key, v);
        v
    }
}

#[fastinst::instrument]
fn expensive(key: u64) -> u64 {
    (0..200u64).fold(key, |h, i| h.rotate_left(5) ^ i.wrapping_mul(0x9E37_79B9))
}

#[fastinst::instrument]
fn render<T: std::fmt::Display>(value: T, part: u32, out: &mut String) {
    PARTS.fetch_add(1, Ordering::Relaxed);
    use std::fmt::Write;
    let _ = write!(out, "{value}:{part};");
}

#[fastinst::instrument]
fn handle(line: &str, cache: &Cache) -> usize {
    let req = parse(line);
    let v = cache.lookup(req.key);
    let mut out = String::new();
    for part in 0..req.parts {
        render(v, part, &mut out);
    }
    out.len()
}

fn main() {
    let mut args = std::env::args().skip(1);
    let requests: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(200_000);
    let threads: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(4);
    let cache = Cache {
        shards: (0..16).map(|_| Mutex::new(HashMap::new())).collect(),
    };
    let next = AtomicU64::new(0);
    let bytes = AtomicU64::new(0);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= requests {
                    break;
                }
                let line = format!("{} {}", (i * 7919) % 5000, 1 + i % 5);
                bytes.fetch_add(handle(&line, &cache) as u64, Ordering::Relaxed);
            });
        }
    });
    println!(
        "served {requests} requests on {threads} threads: {} cache misses, {} parts, {} bytes",
        MISSES.load(Ordering::Relaxed),
        PARTS.load(Ordering::Relaxed),
        bytes.load(Ordering::Relaxed)
    );
}
