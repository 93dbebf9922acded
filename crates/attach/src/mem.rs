//! Reading and writing a stopped process's memory through
//! `/proc/PID/mem`, which the kernel lets a ptrace attacher write even
//! where the pages are not writable (code).

use crate::error::{AttachError, Result};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;

/// The memory of one process.
pub struct Mem {
    file: File,
    pid: i32,
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
        Ok(Mem { file, pid })
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

    /// Writes `bytes` at `addr`.
    pub fn write(&self, addr: u64, bytes: &[u8]) -> Result<()> {
        self.file.write_all_at(bytes, addr).map_err(AttachError::io(format!(
            "writing {} bytes at {addr:#x} of process {}",
            bytes.len(),
            self.pid
        )))
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
