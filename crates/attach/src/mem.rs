//! Reading and writing a stopped process's memory through
//! `/proc/PID/mem`, which the kernel lets a ptrace attacher write even
//! where the pages are not writable (code), unless the pages are shared:
//! code the runtime aliased for W^X is written through its alias
//! ([`crate::maps::alias_of`]).

use crate::error::{AttachError, Result};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;

/// The memory of one process.
pub struct Mem {
    file: File,
    pid: i32,
    /// The process's mappings as last read for a write to aliased code.
    maps: std::sync::Mutex<Vec<crate::maps::Mapping>>,
}

impl Mem {
    /// Opens process `pid`'s memory for reading and writing.
    pub fn open(pid: i32) -> Result<Mem> {
        let path = format!("/proc/{pid}/mem");
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(AttachError::io(path))?;
        Ok(Mem {
            file,
            pid,
            maps: std::sync::Mutex::new(Vec::new()),
        })
    }

    /// The process.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Reads `buf.len()` bytes at `addr`.
    pub fn read(&self, addr: u64, buf: &mut [u8]) -> Result<()> {
        self.file.read_exact_at(buf, addr).map_err(AttachError::io(format!(
            "reading {} bytes at {addr:#x} of process {}",
            buf.len(),
            self.pid
        )))
    }

    /// Writes `bytes` at `addr` (bytes of one mapping). Code that the
    /// runtime aliased for W^X is written through its alias.
    pub fn write(&self, addr: u64, bytes: &[u8]) -> Result<()> {
        let what = || format!("writing {} bytes at {addr:#x} of process {}", bytes.len(), self.pid);
        // Code already seen aliased goes to its alias at once (an alias
        // stays for the life of the process): refused first, each write
        // was two system calls, thousands of them while a detach holds
        // every thread stopped.
        let known = crate::maps::alias_of(&self.maps.lock().unwrap_or_else(|e| e.into_inner()), addr);
        if let Some(alias) = known {
            return self.file.write_all_at(bytes, alias).map_err(AttachError::io(what()));
        }
        match self.file.write_all_at(bytes, addr) {
            // The kernel refuses writes to shared mappings without write
            // permission with EIO: aliased code, or memory that is not
            // writable at all.
            Err(e) if e.raw_os_error() == Some(libc::EIO) => match self.alias_of(addr)? {
                Some(alias) => self.file.write_all_at(bytes, alias).map_err(AttachError::io(what())),
                None => Err(AttachError::io(what())(e)),
            },
            r => r.map_err(AttachError::io(what())),
        }
    }

    /// Where `addr`'s alias is, from the maps as last read, or read again.
    fn alias_of(&self, addr: u64) -> Result<Option<u64>> {
        let mut maps = self.maps.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(a) = crate::maps::alias_of(&maps, addr) {
            return Ok(Some(a));
        }
        *maps = crate::maps::of(self.pid)?;
        Ok(crate::maps::alias_of(&maps, addr))
    }

    /// Writes each `(address, bytes)` (sorted by address, not
    /// overlapping) a stretch of nearby ones at a time ([`stretches`],
    /// [`WRITE_SPAN`]): read, changed and written back whole. One read and
    /// one write a stretch, not one write each: a detach puts back
    /// thousands of sites or hook calls while every thread stands stopped,
    /// and each write is a system call or two. Every thread of the process
    /// must be stopped, so that no byte between them changes meanwhile.
    pub fn write_each(&self, writes: &[(u64, &[u8])]) -> Result<()> {
        debug_assert!(writes.is_sorted_by_key(|w| w.0));
        let mut buf = Vec::new();
        let ranges = writes.iter().map(|(a, b)| (*a, b.len() as u64));
        for (start, end, i, j) in stretches(ranges, WRITE_SPAN) {
            buf.resize((end - start) as usize, 0);
            self.read(start, &mut buf)?;
            for (addr, bytes) in &writes[i..j] {
                let o = (addr - start) as usize;
                buf[o..o + bytes.len()].copy_from_slice(bytes);
            }
            self.write(start, &buf)?;
        }
        Ok(())
    }

    /// Reads a NUL-terminated string at `addr` (at most 4 KiB).
    pub fn c_string(&self, addr: u64) -> Result<String> {
        let mut out = Vec::new();
        let mut chunk = [0u8; 256];
        while out.len() < 4096 {
            self.read(addr + out.len() as u64, &mut chunk)?;
            match chunk.iter().position(|&b| b == 0) {
                Some(n) => {
                    out.extend_from_slice(&chunk[..n]);
                    break;
                }
                None => out.extend_from_slice(&chunk),
            }
        }
        Ok(String::from_utf8_lossy(&out).into_owned())
    }
}

/// The longest stretch one write of [`Mem::write_each`] spans: a write
/// makes a private copy of every page it touches, so a stretch starts and
/// ends with a write of its own (two pages at most, each holding one,
/// copied already by the runtime's own write there).
pub const WRITE_SPAN: u64 = 4096;

/// Ranges `(address, length)` (sorted by address, not overlapping) cut
/// into stretches of at most `span` bytes, each from a range's first byte
/// to a later one's last: `(start, end, first index, one past the last)`.
pub fn stretches(ranges: impl IntoIterator<Item = (u64, u64)>, span: u64) -> Vec<(u64, u64, usize, usize)> {
    let mut out: Vec<(u64, u64, usize, usize)> = Vec::new();
    for (i, (a, len)) in ranges.into_iter().enumerate() {
        let end = a + len;
        match out.last_mut() {
            Some(last) if end - last.0 <= span => {
                last.1 = last.1.max(end);
                last.3 = i + 1;
            }
            _ => out.push((a, end, i, i + 1)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stretches_join_near_ranges_within_their_span() {
        let sleds = [0x1000, 0x1010, 0x1ff0, 0x2000, 0x9000].map(|a| (a, 5));
        assert_eq!(
            stretches(sleds, 4096),
            vec![(0x1000, 0x1ff5, 0, 3), (0x2000, 0x2005, 3, 4), (0x9000, 0x9005, 4, 5)]
        );
        assert_eq!(stretches(sleds, 64 << 10), vec![(0x1000, 0x9005, 0, 5)]);
        assert!(stretches([], 4096).is_empty());
        // Ranges of their own lengths: a stretch ends at its last one's end.
        let runs = [(0x1000, 5), (0x1010, 2), (0x1ff0, 16), (0x2001, 5), (0x9000, 1)];
        assert_eq!(
            stretches(runs, 4096),
            vec![(0x1000, 0x2000, 0, 3), (0x2001, 0x2006, 3, 4), (0x9000, 0x9001, 4, 5)]
        );
    }
}
