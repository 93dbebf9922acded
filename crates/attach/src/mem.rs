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
