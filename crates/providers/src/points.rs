//! Point probes of Rust code (`fastinst::probe!("name")`): a 5-byte NOP at
//! a point in a function, recorded with its name in the `fastinst_points`
//! section.
//!
//! A record is two 8-byte words: the NOP's address and the address of its
//! NUL-terminated name (relocated like any table of addresses: see
//! [`crate::sections::words`]). The NOP is toggled as a sled's is, to a
//! `call` into the runtime; unlike a sled it is not at a function entry, so
//! it has no exit probe.

use crate::elf::ElfError;
use crate::memory::Memory;
use crate::sections::Sections;
use goblin::elf::Elf;

/// The section the points are recorded in (`fastinst-macros` writes it:
/// keep the two in step).
pub const SECTION: &str = "fastinst_points";
/// The NOP a point is.
pub const NOP: [u8; 5] = [0x0F, 0x1F, 0x44, 0x00, 0x00];
/// Longest name read.
pub const MAX_NAME: usize = 256;

/// One point, at the file's virtual addresses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Point {
    /// The NOP's first byte.
    pub addr: u64,
    /// Its name.
    pub name: String,
}

/// Why a recorded point is not used.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PointError {
    /// The bytes at the point are not the NOP.
    #[error("the recorded point is not the 5-byte NOP")]
    NotANop,
    /// Its name cannot be read.
    #[error("the point's name cannot be read")]
    NoName,
}

/// Whether the file has points (a section name, no code read).
pub fn has_points(sections: &Sections) -> bool {
    sections.named(SECTION).next().is_some()
}

/// The usable points of a file, and those left alone with why.
pub type Points = (Vec<Point>, Vec<(u64, PointError)>);

/// The points of the ELF file `bytes`, and those left alone with why.
pub fn points_in_elf(bytes: &[u8]) -> Result<Points, ElfError> {
    let sections = Sections::parse(bytes)?;
    let words = crate::sections::words(&sections, SECTION);
    if words.is_empty() {
        return Ok(Default::default());
    }
    let elf = Elf::parse(bytes)?;
    let image = crate::fileimage::file_image(&elf, bytes);
    let mut out = (Vec::new(), Vec::new());
    for pair in words.chunks_exact(2) {
        let (addr, name) = (pair[0], pair[1]);
        if addr == 0 {
            // The linker dropped the function.
            continue;
        }
        match point_at(&image, addr, name) {
            Ok(p) => out.0.push(p),
            Err(e) => out.1.push((addr, e)),
        }
    }
    Ok(out)
}

/// The point at `addr` named by the string at `name`.
pub fn point_at<M: Memory + ?Sized>(mem: &M, addr: u64, name: u64) -> Result<Point, PointError> {
    let mut b = [0u8; 5];
    if !mem.read(addr, &mut b) || b != NOP {
        return Err(PointError::NotANop);
    }
    let mut s = Vec::new();
    for k in 0..MAX_NAME as u64 {
        let mut c = [0u8];
        if !mem.read(name + k, &mut c) {
            return Err(PointError::NoName);
        }
        if c[0] == 0 {
            return Ok(Point {
                addr,
                name: String::from_utf8_lossy(&s).into_owned(),
            });
        }
        s.push(c[0]);
    }
    Err(PointError::NoName)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::Image;

    #[test]
    fn a_point_is_the_nop_and_a_terminated_name() {
        let mem = Image::new()
            .with(0x1000, [NOP.to_vec(), vec![0xC3]].concat())
            .with(0x2000, b"cache-miss\0".to_vec())
            .with(0x3000, b"unterminated".to_vec())
            .with(0x4000, vec![0x90; 5]);
        assert_eq!(
            point_at(&mem, 0x1000, 0x2000),
            Ok(Point {
                addr: 0x1000,
                name: "cache-miss".into()
            })
        );
        assert_eq!(point_at(&mem, 0x1000, 0x3000), Err(PointError::NoName));
        assert_eq!(point_at(&mem, 0x4000, 0x2000), Err(PointError::NotANop));
    }
}
