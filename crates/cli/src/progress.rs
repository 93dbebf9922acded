//! Progress of a step that may take a while: nothing for a quick one; for
//! one that passes a second, a line on stderr saying what is being done
//! and, on a terminal, for how long so far, then how long it took.

use std::io::Write;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long a step runs before it is shown.
pub const SHOWN_AFTER: Duration = Duration::from_secs(1);

/// Runs `f`, saying on stderr that `what` is under way once it passes
/// [`SHOWN_AFTER`].
pub fn step<T>(what: &str, f: impl FnOnce() -> T) -> T {
    // SAFETY: isatty only reads the descriptor's state.
    let tty = unsafe { libc::isatty(2) } == 1;
    step_to(what, SHOWN_AFTER, tty, std::io::stderr(), f)
}

/// [`step`], writing to `out` after `after`; `tty`: a terminal, where the
/// line is rewritten each second with the time so far.
pub fn step_to<T, W: Write + Send>(what: &str, after: Duration, tty: bool, mut out: W, f: impl FnOnce() -> T) -> T {
    let (done, wait) = mpsc::channel::<()>();
    let began = Instant::now();
    std::thread::scope(|s| {
        let shower = s.spawn(move || {
            if wait.recv_timeout(after).is_ok() {
                return;
            }
            let _ = write!(out, "fastinst: {what}...");
            let _ = out.flush();
            loop {
                match wait.recv_timeout(Duration::from_secs(1)) {
                    Err(mpsc::RecvTimeoutError::Timeout) if tty => {
                        let _ = write!(out, "\rfastinst: {what}... {:.0} s", began.elapsed().as_secs_f64());
                        let _ = out.flush();
                    }
                    Err(mpsc::RecvTimeoutError::Timeout) => {}
                    _ => break,
                }
            }
            let end = if tty { "\r" } else { "\n" };
            let _ = writeln!(
                out,
                "{end}fastinst: {what}: done in {:.1} s",
                began.elapsed().as_secs_f64()
            );
        });
        let r = f();
        let _ = done.send(());
        let _ = shower.join();
        r
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);
    impl Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_step_past_the_threshold_is_shown_and_a_quick_one_is_not() {
        let shown = Buf::default();
        let v = step_to("rendering", Duration::ZERO, false, shown.clone(), || {
            std::thread::sleep(Duration::from_millis(20));
            7
        });
        assert_eq!(v, 7);
        let text = String::from_utf8(shown.0.lock().unwrap().clone()).unwrap();
        assert!(
            text.starts_with("fastinst: rendering...\nfastinst: rendering: done in "),
            "{text}"
        );
        let quiet = Buf::default();
        step_to("rendering", Duration::from_secs(3600), false, quiet.clone(), || ());
        assert!(quiet.0.lock().unwrap().is_empty());
    }
}
