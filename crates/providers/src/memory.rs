//! How providers read code: through [`Memory`], never a raw pointer.

/// Read access to the code and data of one address space.
pub trait Memory {
    /// Copies the bytes at `addr` into `buf`; `false` (and `buf` unspecified)
    /// if any of them is not readable.
    fn read(&self, addr: u64, buf: &mut [u8]) -> bool;

    /// Length of an instruction at `addr` that the runtime has patched (its
    /// bytes may transiently hold anything: an inactive form, an INT3 lock):
    /// decoders step over it as an opaque instruction. `None` by default.
    fn patched_len(&self, _addr: u64) -> Option<usize> {
        None
    }

    /// The little-endian u64 at `addr`.
    fn read_u64(&self, addr: u64) -> Option<u64> {
        let mut b = [0u8; 8];
        self.read(addr, &mut b).then(|| u64::from_le_bytes(b))
    }
}

/// An address space made of byte buffers at given addresses (for tests and
/// offline analysis of ELF files).
#[derive(Clone, Debug, Default)]
pub struct Image {
    segments: Vec<(u64, Vec<u8>)>,
}

impl Image {
    /// An empty image.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `bytes` at `addr`.
    pub fn with(mut self, addr: u64, bytes: impl Into<Vec<u8>>) -> Self {
        self.segments.push((addr, bytes.into()));
        self
    }

    /// Whether the `len` bytes at `addr` lie inside one segment.
    pub fn contains(&self, addr: u64, len: usize) -> bool {
        self.segments.iter().any(|(base, seg)| {
            addr >= *base
                && addr
                    .checked_add(len as u64)
                    .is_some_and(|e| e <= *base + seg.len() as u64)
        })
    }

    /// Writes `bytes` at `addr`, which must lie inside one segment.
    pub fn write(&mut self, addr: u64, bytes: &[u8]) {
        for (base, seg) in &mut self.segments {
            if addr >= *base && addr + bytes.len() as u64 <= *base + seg.len() as u64 {
                let o = (addr - *base) as usize;
                seg[o..o + bytes.len()].copy_from_slice(bytes);
                return;
            }
        }
        panic!("write outside the image at {addr:#x}");
    }
}

impl Memory for Image {
    fn read(&self, addr: u64, buf: &mut [u8]) -> bool {
        for (base, seg) in &self.segments {
            let end = *base + seg.len() as u64;
            if addr >= *base && addr.checked_add(buf.len() as u64).is_some_and(|e| e <= end) {
                let o = (addr - *base) as usize;
                buf.copy_from_slice(&seg[o..o + buf.len()]);
                return true;
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_inside_segments_only() {
        let m = Image::new().with(0x1000, vec![1, 2, 3, 4]);
        let mut b = [0u8; 2];
        assert!(m.read(0x1002, &mut b));
        assert_eq!(b, [3, 4]);
        assert!(!m.read(0x1003, &mut b));
        assert!(!m.read(0xfff, &mut b));
        assert_eq!(m.read_u64(0x1000), None);
    }
}
