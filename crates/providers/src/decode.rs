//! An instruction stream over [`Memory`], shared by the providers.

use crate::memory::Memory;
use iced_x86::{Decoder, DecoderOptions, Instruction};

/// Longest x86 instruction.
pub const MAX_INSN_LEN: usize = 15;

/// One step of a [`Stream`].
#[derive(Clone, Debug)]
pub enum Step {
    /// A decoded instruction.
    Insn(Instruction),
    /// An instruction the runtime has patched, stepped over whole.
    Patched {
        /// Its address.
        ip: u64,
        /// Its length.
        len: usize,
    },
}

impl Step {
    /// Address of the instruction.
    pub fn ip(&self) -> u64 {
        match self {
            Step::Insn(i) => i.ip(),
            Step::Patched { ip, .. } => *ip,
        }
    }

    /// Address after it.
    pub fn next_ip(&self) -> u64 {
        match self {
            Step::Insn(i) => i.next_ip(),
            Step::Patched { ip, len } => ip + *len as u64,
        }
    }
}

/// Decodes linearly from `ip` up to `end`. Ends (returns `None`) at `end`, at
/// an invalid instruction or at unreadable bytes; [`Stream::failed`] tells
/// the last two apart from a clean end.
pub struct Stream<'m, M: Memory + ?Sized> {
    mem: &'m M,
    ip: u64,
    end: u64,
    failed: bool,
}

impl<'m, M: Memory + ?Sized> Stream<'m, M> {
    /// A stream over `[ip, end)`.
    pub fn new(mem: &'m M, ip: u64, end: u64) -> Self {
        Stream {
            mem,
            ip,
            end,
            failed: false,
        }
    }

    /// True if the stream stopped before `end` (invalid or unreadable bytes).
    pub fn failed(&self) -> bool {
        self.failed
    }

    /// The address the next step would start at.
    pub fn ip(&self) -> u64 {
        self.ip
    }
}

/// Decodes the one instruction at `ip`, reading at most `max` bytes.
pub fn decode_one<M: Memory + ?Sized>(mem: &M, ip: u64, max: usize) -> Option<Instruction> {
    let mut buf = [0u8; MAX_INSN_LEN];
    let mut n = max.min(MAX_INSN_LEN);
    // Near the end of a mapping fewer bytes are readable; an instruction
    // needs only its own.
    while n > 0 && !mem.read(ip, &mut buf[..n]) {
        n -= 1;
    }
    if n == 0 {
        return None;
    }
    let mut d = Decoder::with_ip(64, &buf[..n], ip, DecoderOptions::NONE);
    let i = d.decode();
    (!i.is_invalid()).then_some(i)
}

impl<M: Memory + ?Sized> Iterator for Stream<'_, M> {
    type Item = Step;

    fn next(&mut self) -> Option<Step> {
        if self.ip >= self.end || self.failed {
            return None;
        }
        if let Some(len) = self.mem.patched_len(self.ip) {
            let s = Step::Patched { ip: self.ip, len };
            self.ip += len as u64;
            return Some(s);
        }
        match decode_one(self.mem, self.ip, (self.end - self.ip) as usize) {
            Some(i) => {
                self.ip = i.next_ip();
                Some(Step::Insn(i))
            }
            None => {
                self.failed = true;
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::Image;

    struct Patched(Image);
    impl Memory for Patched {
        fn read(&self, a: u64, b: &mut [u8]) -> bool {
            self.0.read(a, b)
        }
        fn patched_len(&self, a: u64) -> Option<usize> {
            (a == 0x1001).then_some(5)
        }
    }

    #[test]
    fn steps_over_patched_instructions() {
        // nop; <patched EB 03 + garbage>; ret
        let img = Image::new().with(0x1000, vec![0x90, 0xEB, 0x03, 0xFF, 0xFF, 0xFF, 0xC3]);
        let ips: Vec<u64> = Stream::new(&Patched(img.clone()), 0x1000, 0x1007)
            .map(|s| s.ip())
            .collect();
        assert_eq!(ips, vec![0x1000, 0x1001, 0x1006]);
        // Without the overlay the garbage desynchronises the decode.
        let mut s = Stream::new(&img, 0x1000, 0x1007);
        let ips: Vec<u64> = s.by_ref().map(|s| s.ip()).collect();
        assert_ne!(ips, vec![0x1000, 0x1001, 0x1006]);
    }

    #[test]
    fn stops_on_unreadable_bytes() {
        let img = Image::new().with(0x1000, vec![0x90, 0x48]);
        let mut s = Stream::new(&img, 0x1000, 0x1010);
        assert_eq!(s.by_ref().count(), 1);
        assert!(s.failed());
    }
}
