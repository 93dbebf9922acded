//! A process's mappings (`/proc/PID/maps`) and the ELF modules they hold.

use crate::error::{AttachError, Result};
use std::path::PathBuf;

/// One mapping.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    /// First byte.
    pub start: u64,
    /// One past the last.
    pub end: u64,
    /// `rwxp`-style permissions.
    pub perms: String,
    /// Offset in the file.
    pub offset: u64,
    /// The file, or a pseudo-name (`[stack]`), or empty. For code the
    /// runtime aliased for W^X, the file the code came from.
    pub path: String,
    /// The inode (0 for anonymous memory).
    pub inode: u64,
    /// For code the runtime aliased for W^X (`wordpatch::WriteMode::Alias`):
    /// the mapping's offset in the runtime's `memfd`, which its writable
    /// alias shares (`offset` is then the file's offset of the code).
    pub memfd_offset: Option<u64>,
}

impl Mapping {
    /// Whether it is executable.
    pub fn exec(&self) -> bool {
        self.perms.as_bytes().get(2) == Some(&b'x')
    }

    /// Whether it is private (copy-on-write), as a loaded module's are.
    pub fn private(&self) -> bool {
        self.perms.as_bytes().get(3) == Some(&b'p')
    }

    /// Whether it is a module's code: executable and private, or aliased
    /// for W^X.
    pub fn code(&self) -> bool {
        self.exec() && (self.private() || self.memfd_offset.is_some())
    }

    /// Whether `addr` lies in it.
    pub fn contains(&self, addr: u64) -> bool {
        (self.start..self.end).contains(&addr)
    }
}

/// Parses the text of `/proc/PID/maps`.
pub fn parse(text: &str) -> Vec<Mapping> {
    text.lines()
        .filter_map(|l| {
            let mut w = l.split_ascii_whitespace();
            let (range, perms, offset) = (w.next()?, w.next()?, w.next()?);
            let (_dev, inode) = (w.next()?, w.next()?);
            let path = w.collect::<Vec<_>>().join(" ");
            let (a, b) = range.split_once('-')?;
            let offset = u64::from_str_radix(offset, 16).ok()?;
            // Aliased code names its file and that file's offset.
            let (path, offset, memfd_offset) = match wordpatch::parse_memfd_name(&path) {
                Some((file_off, file)) => (file.to_string(), file_off + offset, Some(offset)),
                None => (path, offset, None),
            };
            Some(Mapping {
                start: u64::from_str_radix(a, 16).ok()?,
                end: u64::from_str_radix(b, 16).ok()?,
                perms: perms.to_string(),
                offset,
                path,
                inode: inode.parse().ok()?,
                memfd_offset,
            })
        })
        .collect()
}

/// The mappings of process `pid`.
pub fn of(pid: i32) -> Result<Vec<Mapping>> {
    let path = format!("/proc/{pid}/maps");
    match std::fs::read_to_string(&path) {
        Ok(t) => Ok(parse(&t)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(AttachError::NoProcess(pid)),
        Err(e) => Err(AttachError::io(path)(e)),
    }
}

/// An ELF file mapped with code.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Module {
    /// Its path.
    pub path: PathBuf,
    /// Where its file offset 0 is mapped (the lowest mapping of the file).
    pub base: u64,
}

/// Where a write meant for code byte `addr` must go when the runtime
/// aliased that code for W^X: the same byte in the writable mapping of the
/// same `memfd` (code mapped shared and read+execute cannot be written
/// through `/proc/PID/mem`). `None` when `addr` is not aliased code.
pub fn alias_of(maps: &[Mapping], addr: u64) -> Option<u64> {
    let code = maps.iter().find(|m| m.exec() && m.contains(addr))?;
    let at = code.memfd_offset? + (addr - code.start);
    maps.iter()
        .filter(|w| w.inode == code.inode && w.perms.as_bytes().get(1) == Some(&b'w') && !w.exec())
        .find_map(|w| {
            let from = w.memfd_offset?;
            (from..from + (w.end - w.start))
                .contains(&at)
                .then(|| w.start + (at - from))
        })
}

/// The files mapped with an executable mapping, once each, in address
/// order.
pub fn modules(maps: &[Mapping]) -> Vec<Module> {
    let mut out: Vec<Module> = Vec::new();
    for m in maps.iter().filter(|m| m.code() && m.path.starts_with('/')) {
        if out.iter().any(|o| o.path.as_os_str() == m.path.as_str()) {
            continue;
        }
        // The module's first mapping: the nearest private one of the file
        // at offset 0 below its code. Not just any of the file's: a program
        // (the runtime's discovery among them) may map the same file again,
        // shared and read-only, to read it, and such a mapping below the
        // module's once gave `dlopen` a wrong address.
        let base = maps
            .iter()
            .filter(|o| o.path == m.path && o.offset == 0 && o.private() && o.start <= m.start)
            .map(|o| o.start)
            .max()
            .unwrap_or(m.start - m.offset);
        out.push(Module {
            path: PathBuf::from(&m.path),
            base,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
555555554000-555555555000 r--p 00000000 08:01 123 /usr/bin/my prog
555555555000-555555556000 r-xp 00001000 08:01 123 /usr/bin/my prog
7ffff7dc0000-7ffff7de6000 r--p 00000000 08:01 77 /usr/lib/x86_64-linux-gnu/libc.so.6
7ffff7de6000-7ffff7f3b000 r-xp 00026000 08:01 77 /usr/lib/x86_64-linux-gnu/libc.so.6
7ffffffde000-7ffffffff000 rw-p 00000000 00:00 0 [stack]
";

    #[test]
    fn maps_lines_parse_and_modules_have_their_base() {
        let m = parse(MAPS);
        assert_eq!(m.len(), 5);
        assert!(m[1].exec() && !m[0].exec());
        assert_eq!(m[1].path, "/usr/bin/my prog");
        let mods = modules(&m);
        assert_eq!(
            mods,
            vec![
                Module {
                    path: "/usr/bin/my prog".into(),
                    base: 0x5555_5555_4000
                },
                Module {
                    path: "/usr/lib/x86_64-linux-gnu/libc.so.6".into(),
                    base: 0x7fff_f7dc_0000
                },
            ]
        );
    }

    #[test]
    fn aliased_code_is_its_module_s_code_and_is_written_through_its_alias() {
        // The program's code aliased for W^X: its code mapping shared and
        // read+execute, its alias read+write elsewhere, one memfd.
        let m = parse(
            "555555554000-555555555000 r--p 00000000 08:01 123 /usr/bin/my prog\n\
             555555555000-555555557000 r-xs 00000000 00:01 999 /memfd:fastinst-code:1000:/usr/bin/my prog (deleted)\n\
             7ffff0000000-7ffff0002000 rw-s 00000000 00:01 999 /memfd:fastinst-code:1000:/usr/bin/my prog (deleted)\n",
        );
        assert!(m[1].code() && m[1].offset == 0x1000 && m[1].path == "/usr/bin/my prog");
        assert!(!m[2].code());
        assert_eq!(
            modules(&m),
            vec![Module {
                path: "/usr/bin/my prog".into(),
                base: 0x5555_5555_4000
            }]
        );
        assert_eq!(alias_of(&m, 0x5555_5555_6123), Some(0x7fff_f000_1123));
        assert_eq!(alias_of(&m, 0x5555_5555_4123), None, "not code");
        assert_eq!(alias_of(&parse(MAPS), 0x5555_5555_5010), None, "code in place");
    }

    #[test]
    fn a_shared_mapping_of_a_module_file_is_not_its_base() {
        // libc.so.6 mapped again, shared, below the loaded one (what the
        // runtime's reading of ELF files leaves in a process).
        let m = parse(&format!(
            "7ffff0000000-7ffff01d7000 r--s 00000000 08:01 77 /usr/lib/x86_64-linux-gnu/libc.so.6\n{MAPS}"
        ));
        let libc = modules(&m).into_iter().find(|x| x.path.ends_with("libc.so.6")).unwrap();
        assert_eq!(libc.base, 0x7fff_f7dc_0000);
    }
}
