//! Tick measurements of every toggle operation, each beside a baseline taken
//! in the same run, reported as median and p90 in TSC ticks.
//!
//! The TSC of a virtual machine may advance in coarse steps, so cheap
//! operations are timed in batches and divided; the
//! resolution found is printed with the results.

use crate::fixture::{Fixture, NOP5};
use crate::method::{Method, Toggler};
use callpatch::{CallSite, Form, Mode};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use wordpatch::tsc;

/// Median and p90 of per-operation samples, in ticks.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Stats {
    /// Median.
    pub median: f64,
    /// 90th percentile.
    pub p90: f64,
    /// Samples.
    pub n: usize,
}

impl Stats {
    /// Summarises samples (sorted in place).
    pub fn of(samples: &mut [f64]) -> Stats {
        assert!(!samples.is_empty());
        samples.sort_by(|a, b| a.total_cmp(b));
        let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
        Stats {
            median: at(0.5),
            p90: at(0.9),
            n: samples.len(),
        }
    }
}

/// Times `reps` batches of `batch` calls of `op` (the call index is passed)
/// and returns per-call ticks.
pub fn batched(batch: u64, reps: usize, mut op: impl FnMut(u64)) -> Stats {
    let mut v = Vec::with_capacity(reps);
    let mut i = 0u64;
    for _ in 0..reps {
        let t0 = tsc::now_ordered();
        for _ in 0..batch {
            op(i);
            i += 1;
        }
        let t1 = tsc::now_ordered();
        v.push((t1 - t0) as f64 / batch as f64);
    }
    Stats::of(&mut v)
}

/// The smallest non-zero step of the TSC seen in a tight loop.
pub fn tsc_resolution() -> u64 {
    let mut best = u64::MAX;
    for _ in 0..1000 {
        let a = tsc::now();
        let mut b = tsc::now();
        while b == a {
            b = tsc::now();
        }
        best = best.min(b - a);
    }
    best
}

/// One row of the report.
#[derive(Clone, Debug)]
pub struct Row {
    /// What was measured.
    pub op: String,
    /// Ticks per operation.
    pub stats: Stats,
    /// Label of the baseline this row is compared with.
    pub baseline_label: char,
    /// That baseline's median, measured in the same run.
    pub baseline: f64,
}

impl Row {
    /// `op | median | p90 | ratio (baseline)` as a Markdown table row.
    pub fn markdown(&self) -> String {
        format!(
            "| {} | {:.1} | {:.1} | {:.2}x {} |",
            self.op,
            self.stats.median,
            self.stats.p90,
            self.stats.median / self.baseline,
            self.baseline_label
        )
    }
}

/// Baseline B: one locked byte exchange in an idle code line (the floor of
/// any atomic write to code), batched.
pub fn baseline_locked_store(reps: usize) -> Stats {
    let fx = Fixture::new(Form::CallRel32, 0).expect("fixture");
    wordpatch::make_writable(fx.site, 8).expect("writable");
    // SAFETY: the `ret` right after the site, inside the fixture's page.
    let p = unsafe { fx.site.add(fx.form.len()) };
    batched(64, reps, |_| {
        // SAFETY: the page is writable and the byte is only accessed
        // atomically here; exchanging the `ret` for itself changes nothing.
        let b = unsafe { std::sync::atomic::AtomicU8::from_ptr(p) };
        std::hint::black_box(b.swap(0xC3, Ordering::SeqCst));
    })
}

/// Runs `f` while another thread calls the fixture's site in a loop.
fn while_executing<R>(fx: &Arc<Fixture>, f: impl FnOnce() -> R) -> R {
    let stop = Arc::new(AtomicBool::new(false));
    let (f2, s2) = (fx.clone(), stop.clone());
    let h = std::thread::spawn(move || {
        let mut n = 0u64;
        while !s2.load(Ordering::Relaxed) {
            n = n.wrapping_add((f2.entry)());
        }
        n
    });
    std::thread::sleep(std::time::Duration::from_millis(5));
    let r = f();
    stop.store(true, Ordering::Relaxed);
    let _ = h.join();
    r
}

/// Straddler wordpatch toggles take thousands of ticks: time them one by one;
/// everything else in batches of `batch`.
fn batch_for(strategy: Method, fx: &Fixture, batch: u64) -> u64 {
    if wordpatch::is_straddler(fx.site as usize, fx.form.len()) && !strategy.is_callpatch() {
        1
    } else {
        batch
    }
}

/// Baseline C: a plain store of a site's own first byte while another thread
/// executes the site (the cost of touching a line another core runs).
pub fn baseline_busy_store(reps: usize) -> Stats {
    let fx = Arc::new(Fixture::new(Form::CallRel32, 0).expect("fixture"));
    wordpatch::make_writable(fx.site, 8).expect("writable");
    let p = fx.site;
    while_executing(&fx, || {
        batched(16, reps, |_| {
            // SAFETY: storing the site's own opcode byte back: no change in code.
            unsafe { std::ptr::write_volatile(p, 0xE8) }
        })
    })
}

/// Toggle cost of `strategy` on an idle site of `form` at `split`, per toggle.
pub fn toggle_idle(strategy: Method, form: Form, split: usize, reps: usize) -> Result<Stats, String> {
    let fx = Fixture::new(form, split).map_err(|e| e.to_string())?;
    let t = Toggler::new(&fx, strategy)?;
    let r = batched(batch_for(strategy, &fx, 64), reps, |i| {
        t.set(i % 2 == 1).expect("toggle");
    });
    t.ensure_on()?;
    Ok(r)
}

/// Toggle cost while another thread executes the site in a loop.
pub fn toggle_busy(strategy: Method, form: Form, split: usize, reps: usize) -> Result<Stats, String> {
    let fx = Arc::new(Fixture::new(form, split).map_err(|e| e.to_string())?);
    let t = Toggler::new(&fx, strategy)?;
    let r = while_executing(&fx, || {
        batched(batch_for(strategy, &fx, 16), reps, |i| {
            t.set(i % 2 == 1).expect("toggle");
        })
    });
    t.ensure_on()?;
    Ok(r)
}

/// `start_patch` alone on a straddling site (the asynchronous fast half),
/// completed by `flush` outside the timed region.
pub fn async_start(split: usize, reps: usize) -> Result<Stats, String> {
    let fx = Fixture::new(Form::CallRel32, split).map_err(|e| e.to_string())?;
    wordpatch::make_writable(fx.site, 5).map_err(|e| e.to_string())?;
    let on = fx.on_bytes();
    let mut v = Vec::with_capacity(reps);
    for i in 0..reps {
        let new: &[u8] = if i % 2 == 0 { &NOP5 } else { &on };
        let t0 = tsc::now_ordered();
        // SAFETY: the fixture's site holds the other state; both are valid code.
        unsafe { wordpatch::start_patch(fx.site, new, &wordpatch::PatchOptions::default()) }
            .map_err(|e| e.to_string())?;
        let t1 = tsc::now_ordered();
        v.push((t1 - t0) as f64);
        wordpatch::flush();
    }
    if fx.on_bytes() != on {
        return Err("fixture changed".into());
    }
    // SAFETY: as above.
    unsafe { wordpatch::patch(fx.site, &on) }.map_err(|e| e.to_string())?;
    Ok(Stats::of(&mut v))
}

/// A region of `n` idle `call rel32` sites (a `ret` target), laid out at a
/// 13-byte stride so that about 6% straddle, as probes in real code do.
pub struct SiteField {
    base: *mut u8,
    len: usize,
    /// The sites, prepared for toggling.
    pub sites: Vec<CallSite>,
}

impl SiteField {
    /// Generates the field and prepares every site (trampolines included).
    pub fn new(n: usize) -> Result<SiteField, String> {
        let len = (n * 13 + 8192 + 4095) & !4095;
        // SAFETY: a fresh anonymous RWX mapping owned by the field.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error().to_string());
        }
        let base = p as *mut u8;
        let target = len - 64;
        // SAFETY: writing inside the fresh mapping.
        unsafe { *base.add(target) = 0xC3 };
        let mut sites = Vec::with_capacity(n);
        for i in 0..n {
            let off = 64 + i * 13;
            let rel = (target as i64 - (off + 5) as i64) as i32;
            let b = Form::CallRel32.on_bytes(rel);
            // SAFETY: inside the mapping; nothing executes it yet.
            unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), base.add(off), 5) };
            // SAFETY: the bytes just written are a call to a `ret`.
            sites.push(unsafe { CallSite::new(base.add(off), Form::CallRel32, rel) }.map_err(|e| e.to_string())?);
        }
        Ok(SiteField { base, len, sites })
    }

    /// Straddling sites in the field.
    pub fn straddlers(&self) -> usize {
        self.sites.iter().filter(|s| s.split() != 0).count()
    }
}

impl Drop for SiteField {
    fn drop(&mut self) {
        wordpatch::forget_pages(self.base, self.len);
        // SAFETY: unmapping the field's own mapping.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.len) };
    }
}

/// Baseline A: per-site ticks of a pass of plain one-byte stores (each
/// site's own opcode byte) over the field: the floor of any toggle pass.
pub fn field_store_pass(field: &SiteField, reps: usize) -> Stats {
    let n = field.sites.len() as f64;
    let mut v = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t0 = tsc::now_ordered();
        for s in &field.sites {
            // SAFETY: the field's RWX mapping; the byte's own value.
            unsafe { std::ptr::write_volatile(s.addr() as *mut u8, 0xE8) };
        }
        v.push((tsc::now_ordered() - t0) as f64 / n);
    }
    Stats::of(&mut v)
}

/// Per-toggle ticks of a deactivation pass and an activation pass over every
/// site of `field` in `mode`, `reps` passes each.
pub fn field_passes(field: &SiteField, mode: Mode, reps: usize) -> (Stats, Stats) {
    let n = field.sites.len() as f64;
    let (mut off, mut on) = (Vec::new(), Vec::new());
    for _ in 0..reps {
        let t0 = tsc::now_ordered();
        for s in &field.sites {
            s.deactivate(mode).expect("deactivate");
        }
        let t1 = tsc::now_ordered();
        for s in &field.sites {
            s.activate().expect("activate");
        }
        let t2 = tsc::now_ordered();
        off.push((t1 - t0) as f64 / n);
        on.push((t2 - t1) as f64 / n);
    }
    (Stats::of(&mut off), Stats::of(&mut on))
}

/// A fixture whose site is in `state`: `active` (the call), `nop` (a NOP
/// of the site's length), or the off form of `flip` or `paper`. Nothing
/// runs it yet.
pub fn fixture_in_state(form: Form, split: usize, state: &str) -> Result<Fixture, String> {
    match state {
        "active" => Fixture::new(form, split).map_err(|e| e.to_string()),
        "nop" => fixture_with_code(form, split, wordpatch::nop(form.len())),
        "flip" | "paper" => {
            let fx = Fixture::new(form, split).map_err(|e| e.to_string())?;
            let strategy = if state == "flip" {
                Method::CallFlip
            } else {
                Method::CallPaper
            };
            Toggler::new(&fx, strategy)?.set(false)?;
            Ok(fx)
        }
        other => Err(format!("unknown state {other}")),
    }
}

/// A fixture with `code` in place of its site. `code` must be one or more
/// complete instructions of exactly the site's length that fall through
/// (a NOP form: a 5-byte NOP, a provider's sled).
pub fn fixture_with_code(form: Form, split: usize, code: &[u8]) -> Result<Fixture, String> {
    let fx = Fixture::new(form, split).map_err(|e| e.to_string())?;
    if code.len() != fx.form.len() {
        return Err(format!(
            "{} bytes of code for a {}-byte site",
            code.len(),
            fx.form.len()
        ));
    }
    // SAFETY: no thread runs the fixture yet, and `code` (checked to be the
    // site's length; the caller vouches that it falls through) replaces the
    // whole site.
    unsafe { wordpatch::patch(fx.site, code) }.map_err(|e| e.to_string())?;
    Ok(fx)
}

fn invoke_batched(fx: &Fixture, reps: usize) -> Stats {
    let f = fx.entry;
    batched(256, reps, |_| {
        std::hint::black_box(f());
    })
}

/// Ticks per execution of the site in a state (see [`fixture_in_state`]),
/// batched: the latent cost of an inactive probe beside an active one and
/// a plain NOP.
pub fn invoke_cost(form: Form, split: usize, state: &str, reps: usize) -> Result<Stats, String> {
    Ok(invoke_batched(&fixture_in_state(form, split, state)?, reps))
}

/// Ticks per execution of the site with `code` in its place (see
/// [`fixture_with_code`]), measured like [`invoke_cost`].
pub fn invoke_cost_bytes(form: Form, split: usize, code: &[u8], reps: usize) -> Result<Stats, String> {
    Ok(invoke_batched(&fixture_with_code(form, split, code)?, reps))
}
