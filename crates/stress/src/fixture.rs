//! Generated code with a call site at a chosen place in its cache line: a
//! straddle split, or an offset inside one line.
//!
//! Layout inside a 64 MiB reservation that is `PROT_NONE` except for two
//! small read-write-execute islands, both filled with INT3 (read+execute
//! only in [`wordpatch::WriteMode::Alias`]):
//!
//! ```text
//! entry:  31 C0          xor eax, eax        ; "off" result
//! site:   <form>         the toggled instruction, S bytes before a line end
//!         C3             ret
//! A:      B8 01 00 00 00 mov eax, 1          ; "on" result, far away
//!         C3             ret
//! B:      31 C0          xor eax, eax        ; a `call rel32`'s other
//!         C3             ret                 ; target ("off"), farther
//! ```
//!
//! The target `A` is placed so that `rel32` is `0x0102050B` (bytes
//! `0B 05 02 01`). Then every mixture of the front of one state with the back
//! of the other that a torn write could expose crashes: `0F 0B` is `ud2`,
//! `0F 1F 05 ...` is a 7-byte NOP that runs into INT3 filler, and the mixed
//! `call`s land in INT3 filler or in `PROT_NONE`. An executor therefore sees
//! exactly 1 (active), 0 (inactive) or, for the flipped `mov eax, imm32`, the
//! immediate; anything else, or a crash, is a failure.

use callpatch::Form;
use std::io;

/// Size of the address-space reservation.
const ARENA: usize = 64 << 20;
/// `rel32` of the call to `A`; its bytes make torn writes crash (module doc).
pub const REL_A: i32 = 0x0102_050B;
/// `rel32` of a `call rel32` site's second target `B` (`xor eax, eax;
/// ret`: "off"), for the retargeting strategies. It differs from
/// [`REL_A`] in every byte, and every mixture of the two lands in
/// `PROT_NONE` or in INT3 filler.
pub const REL_B: i32 = 0x0204_071C;
/// Offset of the line whose end the site straddles (or which holds it).
const SITE_LINE_END: usize = 64 * 8;
/// Offset of the pointer slot for `call [rip+disp32]`.
const PTR_SLOT: usize = 0x800;
/// The 5-byte NOP that wordpatch tests toggle the call with.
pub use wordpatch::NOP5;

/// Where a site lies against cache lines. A store inside one line is the
/// paper's unit of atomicity, but instruction fetch reads a line in smaller
/// blocks (16 or 32 bytes) and a locked store's window may cross an aligned
/// quadword: a site inside a line is run at each such crossing too.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// The first `n` bytes before a line's end (1 <= n < length): a
    /// straddler.
    Split(usize),
    /// Inside one line, starting `n` bytes into it.
    Inside(usize),
}

impl Place {
    /// The offsets inside a line a stress run covers by default, for sites
    /// of up to 6 bytes: inside an aligned quadword, then across a
    /// quadword, a 16-byte and a 32-byte boundary.
    pub const INSIDE: [usize; 4] = [8, 4, 12, 28];

    /// A straddle split, or for 0 the site inside an aligned quadword.
    pub fn of_split(split: usize) -> Place {
        if split == 0 {
            Place::Inside(Self::INSIDE[0])
        } else {
            Place::Split(split)
        }
    }

    /// Bytes before the line's end where the site straddles, else 0.
    pub fn split(self) -> usize {
        match self {
            Place::Split(n) => n,
            Place::Inside(_) => 0,
        }
    }

    /// The site's address for a line ending (or starting) at `line`.
    fn site(self, line: usize) -> usize {
        match self {
            Place::Split(n) => line - n,
            Place::Inside(n) => line + n,
        }
    }
}

impl std::fmt::Display for Place {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Place::Split(n) => write!(f, "split={n}"),
            Place::Inside(n) => write!(f, "split=0@{n}"),
        }
    }
}

/// One generated site and the code around it. Unmapped on drop.
pub struct Fixture {
    base: usize,
    /// The toggled instruction.
    pub site: *mut u8,
    /// Its form.
    pub form: Form,
    /// Its active operand (rel32 or disp32).
    pub operand: i32,
    /// Runs the site once; returns 1 when it was active.
    pub entry: extern "C" fn() -> u64,
    /// The value `entry` returns when the site is flipped to `mov eax, imm32`.
    pub flip_value: u64,
}

// SAFETY: the fixture's code is shared by design: executing it from any thread
// is the point, and its pages live until the fixture is dropped.
unsafe impl Send for Fixture {}
// SAFETY: as above.
unsafe impl Sync for Fixture {}

fn island_pages(addr: usize, len: usize) -> (usize, usize) {
    let page = addr & !4095;
    (page, (addr + len - page + 4095) & !4095)
}

/// Makes the islands read+execute only, as a program's code is: then
/// wordpatch must make them writable its own way (in
/// [`wordpatch::WriteMode::Alias`], through an alias: W^X).
fn seal(islands: &[(usize, usize)]) -> io::Result<()> {
    for &(page, len) in islands {
        // SAFETY: an island of the fixture's own reservation; its bytes
        // stay as they are.
        if unsafe { libc::mprotect(page as *mut libc::c_void, len, libc::PROT_READ | libc::PROT_EXEC) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

fn rwx_island(addr: usize, len: usize) -> io::Result<()> {
    let (page, len) = island_pages(addr, len);
    // SAFETY: the range lies inside our own PROT_NONE reservation.
    let rc = unsafe {
        libc::mprotect(
            page as *mut libc::c_void,
            len,
            libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: just made writable; INT3 filler.
    unsafe { std::ptr::write_bytes(page as *mut u8, 0xCC, len) };
    Ok(())
}

fn put(addr: usize, bytes: &[u8]) {
    // SAFETY: callers write inside islands made writable by `rwx_island`.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), addr as *mut u8, bytes.len()) };
}

impl Fixture {
    /// A site of `form` whose first `split` bytes lie before a line boundary
    /// (0: inside an aligned quadword), active.
    pub fn new(form: Form, split: usize) -> io::Result<Fixture> {
        Self::at(form, Place::of_split(split))
    }

    /// A site of `form` at `place`, active.
    pub fn at(form: Form, place: Place) -> io::Result<Fixture> {
        match place {
            Place::Split(n) => assert!(0 < n && n < form.len(), "split {n} out of range for {form:?}"),
            Place::Inside(n) => assert!(
                n >= 2 && n + form.len() <= 64,
                "offset {n} out of its line for {form:?}"
            ),
        }
        // SAFETY: a fresh anonymous PROT_NONE reservation, owned by the fixture.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                ARENA,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = p as usize;
        let fx_guard = Unmap(base);
        rwx_island(base, 4096)?;
        let site = place.site(base + SITE_LINE_END);
        let len = form.len();
        let a = (site + 5) as i64 + REL_A as i64;
        rwx_island(a as usize, 8)?;
        put(a as usize, &[0xB8, 1, 0, 0, 0, 0xC3]);
        let b = (site + 5) as i64 + REL_B as i64;
        if form == Form::CallRel32 {
            rwx_island(b as usize, 8)?;
            put(b as usize, &[0x31, 0xC0, 0xC3]);
        }
        let operand = match form {
            Form::CallRel32 | Form::JmpRel32 => (a - (site + 5) as i64) as i32,
            Form::CallRipIndirect | Form::JmpRipIndirect => {
                put(base + PTR_SLOT, &(a as u64).to_le_bytes());
                ((base + PTR_SLOT) as i64 - (site + 6) as i64) as i32
            }
        };
        put(site - 2, &[0x31, 0xC0]);
        put(site, &form.on_bytes(operand)[..len]);
        if !form.is_tail() {
            put(site + len, &[0xC3]);
        }
        std::mem::forget(fx_guard);
        let mut islands = vec![island_pages(base, 4096), island_pages(a as usize, 8)];
        if form == Form::CallRel32 {
            islands.push(island_pages(b as usize, 8));
        }
        if wordpatch::write_mode() == wordpatch::WriteMode::Alias {
            // W^X asked for: the code must be sealed as a program's is, or
            // wordpatch would find it writable and write it in place.
            seal(&islands)?;
        }
        // SAFETY: `site - 2` starts the code laid out above, which follows the
        // C ABI: it returns in rax and clobbers only rax, rdx and flags.
        let entry: extern "C" fn() -> u64 = unsafe { std::mem::transmute(site - 2) };
        Ok(Fixture {
            base,
            site: site as *mut u8,
            form,
            operand,
            entry,
            flip_value: if form == Form::CallRel32 {
                operand as u32 as u64
            } else {
                0
            },
        })
    }

    /// Bytes of the active form.
    pub fn on_bytes(&self) -> Vec<u8> {
        self.form.on_bytes(self.operand)[..self.form.len()].to_vec()
    }

    /// Classifies a value returned by `entry`: `Some(true)` active,
    /// `Some(false)` inactive, `None` impossible (a torn instruction).
    pub fn classify(&self, v: u64) -> Option<bool> {
        match v {
            1 => Some(true),
            0 => Some(false),
            v if v == self.flip_value && v != 0 => Some(false),
            _ => None,
        }
    }
}

struct Unmap(usize);
impl Drop for Unmap {
    fn drop(&mut self) {
        wordpatch::forget_pages(self.0 as *const u8, ARENA);
        // SAFETY: unmaps the reservation this guard was created for.
        unsafe { libc::munmap(self.0 as *mut libc::c_void, ARENA) };
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        drop(Unmap(self.base));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_form_and_split_runs_active() {
        for form in Form::ALL {
            for split in 0..form.len() {
                let f = Fixture::new(form, split).unwrap();
                assert_eq!(wordpatch::split(f.site as usize, form.len()), split);
                assert_eq!((f.entry)(), 1, "{form:?} split {split}");
            }
            for off in Place::INSIDE {
                let f = Fixture::at(form, Place::Inside(off)).unwrap();
                assert_eq!(f.site as usize % 64, off);
                assert_eq!(wordpatch::split(f.site as usize, form.len()), 0);
                assert_eq!((f.entry)(), 1, "{form:?} at {off}");
            }
        }
    }

    #[test]
    fn the_inside_places_cross_each_boundary_a_fetch_or_store_may_split_at() {
        for len in [5, 6] {
            let crosses = |off: usize, unit: usize| off / unit != (off + len - 1) / unit;
            let [aligned, q, b16, b32] = Place::INSIDE;
            assert!(!crosses(aligned, 8));
            assert!(crosses(q, 8) && !crosses(q, 16));
            assert!(crosses(b16, 16) && !crosses(b16, 32));
            assert!(crosses(b32, 32));
        }
    }
}
