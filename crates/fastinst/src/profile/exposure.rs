//! Exposure: the program's own CPU time summed over its threads, the
//! clock that call rates are measured against ([`super::window`]).
//!
//! A thread's exposure grows with the CPU time it uses less the time its
//! hooks took (`crate::clock`): the time it ran the program's own code. A
//! rate of calls per tick of it is a property of the code a thread runs,
//! not of how often the thread runs: a thread blocked in `pthread_join`, or
//! waiting for a CPU with more runnable threads than CPUs, adds nothing to
//! it and makes no calls. (Counted in wall time, a blocked main thread
//! diluted its worker's rates unevenly: in a window where the worker's
//! hooks took half its time, the worker's share of the wall time the rate
//! was taken over fell, and a loop's functions read well under their
//! calls.)
//!
//! Each thread's CPU clock is read with `clock_gettime` on its per-thread
//! clock id (a system call, about a microsecond), by whoever holds the
//! schedule's lock: when windows open and close and at epoch ends. A
//! thread that has exited left its final reading in its store.

use super::state::State;
use super::store::ThreadStore;
use std::sync::atomic::Ordering;

/// The exposure clock's state (the schedule's lock holder only).
#[derive(Default)]
pub(crate) struct Exposure {
    /// CPU time and hook time so far, over all threads (ticks).
    cpu: f64,
    hooks: f64,
    /// TSC ticks per nanosecond of CPU time.
    tpn: f64,

    /// When it was last advanced (wall TSC).
    at: u64,
}

/// A reading of the exposure clock: CPU ticks and hook ticks so far, at
/// wall time `at`; the exposure is their difference. They are kept apart
/// because the CPU time grows evenly while the hooks' time comes in bursts
/// (a window's calls): between two readings, CPU time may be interpolated,
/// hook time not.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Reading {
    pub at: u64,
    pub cpu: f64,
    pub hooks: f64,
    /// Every thread's hook ticks at `at`, summed as they stand.
    pub abs_hooks: f64,
}

impl Reading {
    /// The exposure.
    pub(crate) fn x(&self) -> f64 {
        self.cpu - self.hooks
    }
}

impl Exposure {
    /// Sets the TSC rate (ticks per ns) that CPU times convert at.
    pub(crate) fn set_rate(&mut self, tpn: f64) {
        if tpn > 0.0 {
            self.tpn = tpn;
        }
    }

    /// Advances the clock to now; returns the reading.
    ///
    /// Each thread's CPU clock is read with a system call, one thread after
    /// another, each at its own moment; the reading's moment `at` is taken
    /// after the last, and each thread's CPU time is carried to it at the
    /// share of a CPU the thread had since its last reading (a busy thread
    /// ran on meanwhile, a blocked one did not). The hooks' time is read at
    /// `at` itself, a hook in progress up to `at`.
    pub(crate) fn advance(&mut self, p: &State) -> Reading {
        let tpn = if self.tpn > 0.0 { self.tpn } else { 1.0 };
        for t in p.stores() {
            read_cpu(t);
        }
        let at = wordpatch::tsc::now();
        let mut abs = 0.0;
        for t in p.stores() {
            let (c, h, a) = advance_thread(t, at, tpn);
            self.cpu += c;
            self.hooks += h;
            abs += a;
        }
        self.at = at;
        Reading {
            abs_hooks: abs,
            ..self.reading()
        }
    }

    /// The reading at the last advance.
    pub(crate) fn reading(&self) -> Reading {
        Reading {
            at: self.at,
            cpu: self.cpu,
            hooks: self.hooks.min(self.cpu),
            abs_hooks: 0.0,
        }
    }

    /// The exposure at the last advance.
    pub(crate) fn value(&self) -> f64 {
        self.reading().x()
    }
}

/// Marks a store's clock readings as starting now: its CPU time and hook
/// ticks before this are not exposure (a thread's first hook, on the
/// thread; a forked child's one thread).
pub(crate) fn start_thread(t: &ThreadStore) {
    let cpu = crate::rawthread::thread_cpu_ns();
    let now = wordpatch::tsc::now();
    t.x_cpu.store(cpu, Ordering::Relaxed);
    t.x_cpu_read.store(cpu, Ordering::Relaxed);
    t.x_cpu_at.store(now, Ordering::Relaxed);
    t.x_wall.store(now, Ordering::Relaxed);
    t.x_hooks.store(t.hooks_at(now), Ordering::Relaxed);
}

/// Reads thread `t`'s CPU clock (ns) and notes when.
fn read_cpu(t: &ThreadStore) {
    let cpu = match t.cpu_final.load(Ordering::Acquire) {
        0 => match crate::rawthread::cpu_ns_of(t.tid) {
            Some(c) => c,
            // Exited, its final reading not yet written: no more time.
            None => t.x_cpu_read.load(Ordering::Relaxed),
        },
        c => c,
    };
    t.x_cpu_read.store(cpu, Ordering::Relaxed);
    t.x_cpu_at.store(wordpatch::tsc::now(), Ordering::Relaxed);
}

/// Notes a thread's final CPU time (on the thread, as it exits).
pub(crate) fn end_thread(t: &ThreadStore) {
    t.cpu_final
        .store(crate::rawthread::thread_cpu_ns().max(1), Ordering::Release);
}

/// Thread `t`'s CPU ticks and hook ticks since its last reading, to wall
/// time `at` (its CPU clock just read, [`read_cpu`], and carried to `at`).
/// Its hook time never outgrows its CPU time (a hook descheduled in the
/// middle is charged for the time it did not run, up to
/// `crate::clock::MAX_HOOK`).
fn advance_thread(t: &ThreadStore, at: u64, tpn: f64) -> (f64, f64, f64) {
    let c0 = t.x_cpu.load(Ordering::Relaxed) as f64;
    let w0 = t.x_wall.load(Ordering::Relaxed);
    let read = t.x_cpu_read.load(Ordering::Relaxed) as f64;
    let read_at = t.x_cpu_at.load(Ordering::Relaxed);
    // Its share of a CPU since the last reading carries it from its clock's
    // reading to `at`.
    let share = if read_at > w0 {
        ((read - c0) * tpn / (read_at - w0) as f64).clamp(0.0, 1.0)
    } else {
        0.0
    };
    let dead = t.cpu_final.load(Ordering::Acquire) != 0;
    let cpu = if dead {
        read
    } else {
        read + at.saturating_sub(read_at) as f64 * share / tpn
    };
    // The calling thread is inside a hook (a handler closing windows), one
    // that began after what it closes: its time is not theirs.
    let h = t.hooks_at(at) as f64;
    let dh = (h - t.x_hooks.load(Ordering::Relaxed) as f64).max(0.0);
    t.x_cpu.store(cpu.max(c0) as u64, Ordering::Relaxed);
    t.x_wall.store(at, Ordering::Relaxed);
    t.x_hooks.store(h as u64, Ordering::Relaxed);
    let dc = (cpu - c0).max(0.0) * tpn;
    (dc, dh.min(dc), h)
}

#[cfg(test)]
mod tests {
    #[test]
    fn another_threads_cpu_clock_counts_its_work_and_not_its_sleep() {
        // SAFETY: no preconditions.
        let tid = std::sync::Arc::new(std::sync::atomic::AtomicI32::new(0));
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let t2 = tid.clone();
        let h = std::thread::spawn(move || {
            // SAFETY: gettid has no preconditions.
            t2.store(unsafe { libc::gettid() }, std::sync::atomic::Ordering::Release);
            let t0 = std::time::Instant::now();
            while t0.elapsed() < std::time::Duration::from_millis(20) {
                std::hint::black_box(0);
            }
            rx.recv().unwrap();
        });
        while tid.load(std::sync::atomic::Ordering::Acquire) == 0 {
            std::thread::yield_now();
        }
        std::thread::sleep(std::time::Duration::from_millis(40));
        let a = crate::rawthread::cpu_ns_of(tid.load(std::sync::atomic::Ordering::Acquire)).expect("alive");
        std::thread::sleep(std::time::Duration::from_millis(30));
        let b = crate::rawthread::cpu_ns_of(tid.load(std::sync::atomic::Ordering::Acquire)).expect("alive");
        tx.send(()).unwrap();
        h.join().unwrap();
        // It spun (for as long as the machine let it), then blocked.
        assert!(a > 0, "{a}");
        assert!(b - a < 2_000_000, "a blocked thread's clock stands still: {a} then {b}");
        // Joined, its clock goes once the kernel has released the thread,
        // which may come a moment after the join returns.
        let gone = (0..2000).any(|_| {
            let alive = crate::rawthread::cpu_ns_of(tid.load(std::sync::atomic::Ordering::Acquire)).is_some();
            if alive {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            !alive
        });
        assert!(gone, "the exited thread's clock is gone");
    }
}
