//! A line of text built without allocating, for signal handlers: the
//! runtime's fatal-fault report and the stress harness's crash reports.

/// A line of up to [`Line::CAPACITY`] bytes in a buffer of its own; what
/// does not fit is dropped.
pub struct Line {
    buf: [u8; Line::CAPACITY],
    len: usize,
}

impl Default for Line {
    fn default() -> Line {
        Line {
            buf: [0; Line::CAPACITY],
            len: 0,
        }
    }
}

impl Line {
    /// The most bytes a line holds.
    pub const CAPACITY: usize = 512;

    /// Appends bytes.
    pub fn push(&mut self, s: &[u8]) {
        for &b in s {
            if self.len < self.buf.len() {
                self.buf[self.len] = b;
                self.len += 1;
            }
        }
    }

    /// Appends `v` in decimal.
    pub fn dec(&mut self, v: u64) {
        let mut digits = [0u8; 20];
        let (mut v, mut n) = (v, 0);
        loop {
            digits[n] = b'0' + (v % 10) as u8;
            n += 1;
            v /= 10;
            if v == 0 {
                break;
            }
        }
        for i in (0..n).rev() {
            self.push(&[digits[i]]);
        }
    }

    /// Appends `v` as `0x` and its hexadecimal digits, no leading zeros.
    pub fn hex(&mut self, v: u64) {
        self.push(b"0x");
        self.hex_digits(v, (64 - v.leading_zeros()).div_ceil(4).max(1) as usize);
    }

    /// Appends the last `digits` hexadecimal digits of `v`, zeros leading.
    pub fn hex_digits(&mut self, v: u64, digits: usize) {
        for i in (0..digits).rev() {
            let d = ((v >> (4 * i)) & 0xF) as u8;
            self.push(&[if d < 10 { b'0' + d } else { b'a' + d - 10 }]);
        }
    }

    /// The line so far.
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    /// Writes the line to file descriptor `fd` with one `write(2)`, which is
    /// async-signal-safe; a failed write is not reported (there is no one
    /// to tell).
    pub fn write_to(&self, fd: i32) {
        // SAFETY: the buffer is ours and holds `len` initialised bytes.
        unsafe { libc::write(fd, self.buf.as_ptr().cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::Line;

    #[test]
    fn a_line_holds_numbers_and_stops_at_its_end() {
        let mut l = Line::default();
        l.push(b"ip ");
        l.hex(0x7f00_dead_beef);
        l.push(b" ");
        l.hex(0);
        l.push(b" ");
        l.dec(11);
        l.push(b" ");
        l.dec(0);
        l.push(b" ");
        l.hex_digits(0xb, 2);
        assert_eq!(l.as_bytes(), b"ip 0x7f00deadbeef 0x0 11 0 0b");
        for _ in 0..100 {
            l.hex(u64::MAX);
        }
        assert_eq!(l.as_bytes().len(), Line::CAPACITY);
    }
}
