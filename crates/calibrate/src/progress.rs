//! A one-line progress bar on stderr, drawn only when stderr is a terminal
//! (logs and pipes get the table rows alone).

use std::io::Write as _;
use std::time::Instant;

/// Progress of the sweep.
pub struct Progress {
    tty: bool,
    start: Instant,
    drawn: bool,
}

impl Default for Progress {
    fn default() -> Self {
        Self::new()
    }
}

impl Progress {
    /// A bar that draws when stderr is a terminal.
    pub fn new() -> Progress {
        // SAFETY: isatty only inspects the descriptor.
        let tty = unsafe { libc::isatty(2) } == 1;
        Progress {
            tty,
            start: Instant::now(),
            drawn: false,
        }
    }

    /// Redraws the bar: `done` of `total` cells, the last one described.
    pub fn update(&mut self, done: usize, total: usize, what: &str) {
        if !self.tty || total == 0 {
            return;
        }
        let width = 30;
        let filled = done * width / total;
        let el = self.start.elapsed().as_secs_f64();
        let eta = if done > 0 {
            el / done as f64 * (total - done) as f64
        } else {
            0.0
        };
        let mut e = std::io::stderr().lock();
        let _ = write!(
            e,
            "\r\x1b[2K[{}{}] {done}/{total} cells, {el:.0}s, ~{eta:.0}s left  {what}",
            "#".repeat(filled),
            "-".repeat(width - filled)
        );
        let _ = e.flush();
        self.drawn = true;
    }

    /// Erases the bar so a line can be printed in its place.
    pub fn clear(&mut self) {
        if self.drawn {
            let mut e = std::io::stderr().lock();
            let _ = write!(e, "\r\x1b[2K");
            let _ = e.flush();
            self.drawn = false;
        }
    }
}
