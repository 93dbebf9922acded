//! An instruction stream over [`Memory`], shared by the providers.

use crate::memory::Memory;
use iced_x86::{Decoder, DecoderOptions, Instruction};
use std::collections::VecDeque;

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
///
/// It reads [`CHUNK`] bytes at a time and decodes them with one decoder:
/// discovery decodes whole functions of live code, and a memory read plus a
/// fresh decoder per instruction cost three times the decoding itself.
/// Where a chunk cannot be read (the end of a mapping) it falls back to one
/// instruction at a time, reading only the bytes that instruction needs.
pub struct Stream<'m, M: Memory + ?Sized> {
    mem: &'m M,
    /// Where decoding continues (after what `ahead` holds).
    ip: u64,
    end: u64,
    /// The stream stopped at `ip`; reported once `ahead` is drained.
    failed: bool,
    /// Steps decoded from the last chunk and not yet yielded.
    ahead: VecDeque<Step>,
}

/// Bytes read and decoded at a time.
pub const CHUNK: usize = 512;

impl<'m, M: Memory + ?Sized> Stream<'m, M> {
    /// A stream over `[ip, end)`.
    pub fn new(mem: &'m M, ip: u64, end: u64) -> Self {
        Stream {
            mem,
            ip,
            end,
            failed: false,
            ahead: VecDeque::new(),
        }
    }

    /// True if the stream stopped before `end` (invalid or unreadable bytes).
    pub fn failed(&self) -> bool {
        self.failed && self.ahead.is_empty()
    }

    /// The address the next step would start at.
    pub fn ip(&self) -> u64 {
        self.ahead.front().map_or(self.ip, Step::ip)
    }

    /// Decodes the next chunk into `ahead`, or the next instruction alone
    /// where the chunk is unreadable; sets `failed` where decoding stops.
    fn fill(&mut self) {
        let want = ((self.end - self.ip) as usize).min(CHUNK);
        let mut buf = [0u8; CHUNK];
        if !self.mem.read(self.ip, &mut buf[..want]) {
            return self.step_alone();
        }
        let base = self.ip;
        // A chunk that stops short of `end` may cut its last instruction:
        // decoding stops MAX_INSN_LEN bytes early and resumes there.
        let stop = if base + want as u64 == self.end {
            want
        } else {
            want.saturating_sub(MAX_INSN_LEN)
        };
        let mut d = Decoder::with_ip(64, &buf[..want], base, DecoderOptions::NONE);
        let mut insn = Instruction::default();
        while d.position() < stop {
            let ip = base + d.position() as u64;
            if let Some(len) = self.mem.patched_len(ip) {
                self.ahead.push_back(Step::Patched { ip, len });
                let next = d.position() + len;
                if next > want || d.set_position(next).is_err() {
                    self.ip = ip + len as u64;
                    return;
                }
                d.set_ip(ip + len as u64);
                continue;
            }
            d.decode_out(&mut insn);
            if insn.is_invalid() {
                self.ip = ip;
                self.failed = true;
                return;
            }
            self.ahead.push_back(Step::Insn(insn));
        }
        self.ip = base + d.position() as u64;
        if self.ahead.is_empty() && !self.failed {
            // Fewer than MAX_INSN_LEN bytes left before an unreadable end.
            self.step_alone();
        }
    }

    fn step_alone(&mut self) {
        if let Some(len) = self.mem.patched_len(self.ip) {
            self.ahead.push_back(Step::Patched { ip: self.ip, len });
            self.ip += len as u64;
            return;
        }
        match decode_one(self.mem, self.ip, (self.end - self.ip) as usize) {
            Some(i) => {
                self.ip = i.next_ip();
                self.ahead.push_back(Step::Insn(i));
            }
            None => self.failed = true,
        }
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

/// Instruction boundaries of one function, every [`Checkpoints::EVERY`]th,
/// found by decoding it once, as far as asked. A search that needs only the
/// few instructions before an address (the argument-load search) starts at
/// a checkpoint close before it instead of at the function start: without
/// them, each of a big function's sites decoded it from the start again.
///
/// A checkpoint stays valid while the code is patched: patched instructions
/// keep their boundaries and the stream steps over them whole.
#[derive(Clone, Debug)]
pub struct Checkpoints {
    starts: Vec<u64>,
    end: u64,
    /// The decode reached `end` or stopped (invalid or unreadable bytes).
    done: bool,
}

impl Checkpoints {
    /// Instructions between consecutive checkpoints.
    pub const EVERY: usize = 32;

    /// Checkpoints of the function `[start, end)`; nothing is decoded yet.
    pub fn new(start: u64, end: u64) -> Self {
        Checkpoints {
            starts: vec![start],
            end,
            done: start >= end,
        }
    }

    /// A boundary at or before `addr` with at least `insns` instructions
    /// between it and `addr` (or the function start when there are fewer),
    /// decoding further into the function first where needed. Decoding from
    /// it reaches `addr` exactly when decoding from the start would.
    pub fn before<M: Memory + ?Sized>(&mut self, mem: &M, addr: u64, insns: usize) -> u64 {
        let last = *self.starts.last().expect("the start is always there");
        if !self.done && last <= addr {
            let mut n = 0;
            let mut past = false;
            for step in Stream::new(mem, last, self.end) {
                n += 1;
                if n % Self::EVERY == 0 {
                    let ip = step.next_ip();
                    if ip >= self.end {
                        break;
                    }
                    self.starts.push(ip);
                    if ip > addr {
                        past = true;
                        break;
                    }
                }
            }
            self.done = !past;
        }
        let k = self.starts.partition_point(|&s| s <= addr);
        self.starts[k.saturating_sub(1).saturating_sub(insns.div_ceil(Self::EVERY))]
    }
}

impl<M: Memory + ?Sized> Iterator for Stream<'_, M> {
    type Item = Step;

    fn next(&mut self) -> Option<Step> {
        if self.ahead.is_empty() && self.ip < self.end && !self.failed {
            self.fill();
        }
        self.ahead.pop_front()
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

    /// 600 instructions (nop; mov eax, imm32; lea rdi, [rip+x]; movabs
    /// rax, imm64; jmp +0: lengths 1, 5, 7, 10, 2), across several chunks.
    fn mixed_lengths() -> Vec<u8> {
        let unit: Vec<u8> = [
            &[0x90][..],
            &[0xB8, 1, 2, 3, 4],
            &[0x48, 0x8D, 0x3D, 1, 2, 3, 4],
            &[0x48, 0xB8, 1, 2, 3, 4, 5, 6, 7, 8],
            &[0xEB, 0x00],
        ]
        .concat();
        unit.iter().copied().cycle().take(unit.len() * 120).collect()
    }

    /// The stream one instruction at a time, as it was before chunks.
    fn reference<M: Memory>(mem: &M, mut ip: u64, end: u64) -> (Vec<u64>, bool) {
        let mut ips = Vec::new();
        while ip < end {
            ips.push(ip);
            if let Some(len) = mem.patched_len(ip) {
                ip += len as u64;
                continue;
            }
            match decode_one(mem, ip, (end - ip) as usize) {
                Some(i) => ip = i.next_ip(),
                None => {
                    ips.pop();
                    return (ips, true);
                }
            }
        }
        (ips, false)
    }

    struct Overlay(Image, Vec<(u64, usize)>);
    impl Memory for Overlay {
        fn read(&self, a: u64, b: &mut [u8]) -> bool {
            self.0.read(a, b)
        }
        fn patched_len(&self, a: u64) -> Option<usize> {
            self.1.iter().find(|p| p.0 == a).map(|p| p.1)
        }
    }

    #[test]
    fn chunks_decode_what_single_steps_decode() {
        let code = mixed_lengths();
        let base = 0x10_0000u64;
        let end = base + code.len() as u64;
        // Patched instructions (garbage underneath) at the start, across
        // the first chunk's cut, and at the very end.
        let mut bytes = code.clone();
        let cut = base + (CHUNK - MAX_INSN_LEN) as u64;
        let at_cut = reference(&Image::new().with(base, code.clone()), base, end)
            .0
            .into_iter()
            .find(|&a| a + 10 > cut)
            .unwrap();
        let last = reference(&Image::new().with(base, code.clone()), base, end)
            .0
            .pop()
            .unwrap();
        let patched: Vec<(u64, usize)> = [base + 1, at_cut, last]
            .iter()
            .map(|&a| {
                let len = decode_one(&Image::new().with(base, code.clone()), a, 15).unwrap().len();
                (a, len)
            })
            .collect();
        for &(a, len) in &patched {
            for b in &mut bytes[(a - base) as usize..(a - base) as usize + len] {
                *b = 0xFF;
            }
        }
        let mem = Overlay(Image::new().with(base, bytes), patched);
        for (from, to) in [(base, end), (base + 6, end - 3), (base, base + 40), (cut - 1, end)] {
            let mut st = Stream::new(&mem, from, to);
            let got: Vec<u64> = st.by_ref().map(|s| s.ip()).collect();
            let (want, failed) = reference(&mem, from, to);
            assert_eq!(got, want, "[{from:#x}, {to:#x})");
            assert_eq!(st.failed(), failed, "[{from:#x}, {to:#x})");
        }
        // Readable bytes end inside the range: the same stop, failed.
        let short = Image::new().with(base, code[..700].to_vec());
        let mut st = Stream::new(&short, base, end);
        let got: Vec<u64> = st.by_ref().map(|s| s.ip()).collect();
        assert_eq!((got, st.failed()), reference(&short, base, end));
    }

    #[test]
    fn checkpoints_give_the_window_that_the_start_gives() {
        let code = mixed_lengths();
        let base = 0x20_0000u64;
        let end = base + code.len() as u64;
        let img = Image::new().with(base, code);
        let all: Vec<u64> = Stream::new(&img, base, end).map(|s| s.ip()).collect();
        let mut cp = Checkpoints::new(base, end);
        // Asked out of order, as a function's sites are discovered.
        for &k in &[500usize, 3, 599, 40, 16, 17, 250] {
            let site = all[k];
            let from = cp.before(&img, site, 16);
            let j = all.iter().position(|&a| a == from).expect("a boundary");
            assert!(j <= k && (k - j >= 16 || j == 0), "k {k}: from index {j}");
            let window: Vec<u64> = Stream::new(&img, from, site).map(|s| s.ip()).collect();
            assert_eq!(window[window.len().saturating_sub(16)..], all[k.saturating_sub(16)..k]);
        }
    }
}
