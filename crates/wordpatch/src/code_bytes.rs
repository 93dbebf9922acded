//! A few bytes of code, held inline: what an error says it found.
//!
//! Errors carry the bytes they found at a site. Held in a `Vec`, building
//! one allocated; the profiler's sampler thread toggles probes without ever
//! entering libc (see `fastinst`'s `rawthread`), so no error a toggle can
//! return may allocate.

use std::fmt;
use std::ops::Deref;

/// Up to 16 bytes of code (longer input is cut: an x86 instruction is at
/// most 15 bytes). Derefs to the bytes; `Debug` prints them as a slice, so
/// `{:02x?}` shows hex.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct CodeBytes {
    len: u8,
    bytes: [u8; 16],
}

impl CodeBytes {
    /// The first (at most 16) bytes of `b`.
    pub fn new(b: &[u8]) -> CodeBytes {
        let len = b.len().min(16);
        let mut bytes = [0u8; 16];
        bytes[..len].copy_from_slice(&b[..len]);
        CodeBytes { len: len as u8, bytes }
    }
}

impl Deref for CodeBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }
}

impl fmt::Debug for CodeBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

impl PartialEq<[u8]> for CodeBytes {
    fn eq(&self, other: &[u8]) -> bool {
        **self == *other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_and_prints_like_a_slice() {
        let b = CodeBytes::new(&[0xe8, 0x01, 0xff]);
        assert_eq!(&*b, &[0xe8, 0x01, 0xff]);
        assert_eq!(format!("{b:02x?}"), format!("{:02x?}", [0xe8u8, 0x01, 0xff]));
        assert_eq!(CodeBytes::new(&[0x90; 20]).len(), 16);
    }
}
