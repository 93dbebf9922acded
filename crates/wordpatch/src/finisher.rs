//! A background thread that completes asynchronous patches.

use crate::inflight;
use crate::patch::flush_pass;
use crate::wakeup;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Completes every asynchronous patch in flight, from its own thread, until
/// dropped. It sleeps while nothing is in flight and is woken by
/// [`start_patch`](crate::start_patch). One finisher per process is enough;
/// more are allowed and share the work.
pub struct Finisher {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl Finisher {
    /// Starts the finisher thread.
    pub fn spawn() -> std::io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let handle = std::thread::Builder::new()
            .name("wordpatch-finisher".into())
            .spawn(move || {
                wakeup::register();
                while !s.load(Ordering::Acquire) {
                    if inflight::pending() == 0 {
                        wakeup::park(Duration::from_millis(5), || {
                            inflight::pending() == 0 && !s.load(Ordering::Acquire)
                        });
                    } else {
                        flush_pass();
                        core::hint::spin_loop();
                    }
                }
            })?;
        Ok(Finisher {
            stop,
            handle: Some(handle),
        })
    }

    /// Stops the thread after it finishes its current pass. Patches still in
    /// flight stay in flight (see [`flush`](crate::flush)).
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(h) = self.handle.take() {
            h.thread().unpark();
            let _ = h.join();
        }
    }
}

impl Drop for Finisher {
    fn drop(&mut self) {
        self.halt();
    }
}
