//! The executable bytes of a process's probed modules beside their files':
//! what an attach finds changed already, and what a detach puts back.
//!
//! The runtime changes a probed module's code in place: its sleds, its
//! `-finstrument-functions` hook calls (switched off to NOPs or jumps),
//! and loads of a hook's argument it rewrote. A detach puts every such
//! byte back from the file, then checks them all. Bytes that already
//! differed from the file before the attach (another tool's, or the
//! program's own) are left as they were found. A module with text
//! relocations, whose code differs from its file by design, is not
//! compared.

use crate::error::Result;
use crate::files::Files;
use crate::maps::{Mapping, Module};
use crate::mem::Mem;
use goblin::elf::dynamic::{DF_TEXTREL, DT_TEXTREL};
use goblin::elf::Elf;
use std::collections::HashMap;

/// Differing runs closer than this are one run: the instructions of one
/// rewrite, where a byte may happen to be the same in both. Kept short:
/// runs of different sites joined into one would hold whole function
/// bodies, and a thread stopped in one would be stepped out of it in vain.
const JOIN: u64 = 4;

/// One run of code bytes that differs from the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Run {
    /// Its first byte in the process.
    pub addr: u64,
    /// The file's bytes there.
    pub file: Vec<u8>,
    /// The process's bytes there when it was read.
    pub now: Vec<u8>,
}

/// An executable mapping of a probed module, with its file's bytes there.
#[derive(Clone, Debug)]
pub struct Region {
    /// The mapping.
    pub mapping: Mapping,
    /// The file's bytes it maps (read once, at the attach: not while every
    /// thread stands stopped).
    pub file: Vec<u8>,
}

/// The executable mappings of `modules` (those of files without text
/// relocations), each with its file's bytes.
pub fn regions(maps: &[Mapping], modules: &[Module], files: &mut Files) -> Vec<Region> {
    let mut textrel: HashMap<&str, bool> = HashMap::new();
    let mut out = Vec::new();
    for m in maps.iter().filter(|m| m.code()) {
        if !modules.iter().any(|md| md.path.as_os_str() == m.path.as_str()) {
            continue;
        }
        let Some(bytes) = files.get(std::path::Path::new(&m.path)) else {
            continue;
        };
        let usable = *textrel
            .entry(m.path.as_str())
            .or_insert_with(|| crate::headers::parse(bytes).is_ok_and(|e| !has_textrel(&e)));
        if usable {
            let start = (m.offset as usize).min(bytes.len());
            let end = (m.offset as usize + (m.end - m.start) as usize).min(bytes.len());
            out.push(Region {
                mapping: m.clone(),
                file: bytes[start..end].to_vec(),
            });
        }
    }
    out
}

fn has_textrel(elf: &Elf) -> bool {
    elf.dynamic
        .as_ref()
        .is_some_and(|d| d.dyns.iter().any(|e| e.d_tag == DT_TEXTREL) || d.info.flags & DF_TEXTREL != 0)
}

/// The runs of `regions` whose bytes in the process differ from the file.
pub fn differing(mem: &Mem, regions: &[Region]) -> Result<Vec<Run>> {
    let mut out = Vec::new();
    let mut now = Vec::new();
    for r in regions {
        now.resize(r.file.len(), 0);
        mem.read(r.mapping.start, &mut now)?;
        out.extend(runs(r.mapping.start, &r.file, &now));
    }
    Ok(out)
}

/// The differing runs of `want` (the file) and `now` (the process), read
/// at `base`.
fn runs(base: u64, want: &[u8], now: &[u8]) -> Vec<Run> {
    let mut out: Vec<Run> = Vec::new();
    let mut i = 0;
    while i < want.len() {
        if want[i] == now[i] {
            i += 1;
            continue;
        }
        let mut j = i + 1;
        while j < want.len()
            && (want[j] != now[j] || (j + 1..want.len().min(j + JOIN as usize)).any(|k| want[k] != now[k]))
        {
            j += 1;
        }
        out.push(Run {
            addr: base + i as u64,
            file: want[i..j].to_vec(),
            now: now[i..j].to_vec(),
        });
        i = j;
    }
    out
}

/// The run of `runs` (sorted by address) that `pc` lies strictly inside:
/// past its first byte and before its end, between two of the
/// instructions it holds, where the file's bytes would cut one in two.
pub fn strictly_inside(runs: &[Run], pc: u64) -> Option<&Run> {
    let i = runs.partition_point(|r| r.addr < pc);
    let r = runs.get(i.checked_sub(1)?)?;
    (pc < r.addr + r.file.len() as u64).then_some(r)
}

/// Writes every run's file bytes back (`runs` sorted by address), with
/// every thread stopped, nearby runs together ([`Mem::write_each`]).
pub fn write_back(mem: &Mem, runs: &[Run]) -> Result<()> {
    let writes: Vec<(u64, &[u8])> = runs.iter().map(|r| (r.addr, &r.file[..])).collect();
    mem.write_each(&writes)
}

/// The runs of `now` that were not there, as they were, at the attach
/// (`before`): the runtime's.
pub fn new_since(before: &[Run], now: Vec<Run>) -> Vec<Run> {
    now.into_iter()
        .filter(|r| {
            !before.iter().any(|b| {
                b.addr <= r.addr && r.addr + r.file.len() as u64 <= b.addr + b.file.len() as u64 && {
                    let o = (r.addr - b.addr) as usize;
                    b.now[o..o + r.now.len()] == r.now[..]
                }
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_join_near_differences_and_keep_both_sides() {
        let want = [
            1u8, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28,
            29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40,
        ];
        let mut now = want;
        now[2] = 0x90;
        now[5] = 0x90;
        now[35] = 0xcc;
        let r = runs(0x1000, &want, &now);
        assert_eq!(r.len(), 2, "{r:?}");
        assert_eq!(
            (r[0].addr, r[0].file.as_slice(), r[0].now.as_slice()),
            (0x1002, &[3u8, 4, 5, 6][..], &[0x90u8, 4, 5, 0x90][..])
        );
        assert_eq!(
            (r[1].addr, r[1].file.as_slice(), r[1].now.as_slice()),
            (0x1000 + 35, &[36u8][..], &[0xccu8][..])
        );
        assert!(runs(0, &want, &want).is_empty());
    }

    #[test]
    fn a_place_strictly_inside_a_run_is_found() {
        let run = |addr: u64, len: usize| Run {
            addr,
            file: vec![0; len],
            now: vec![1; len],
        };
        let runs = [
            run(0x1000, 5),
            run(0x1010, 2),
            run(0x1ff0, 16),
            run(0x2001, 5),
            run(0x9000, 1),
        ];
        let inside = |pc| strictly_inside(&runs, pc).map(|r| r.addr);
        assert_eq!(inside(0x1000), None, "a run's first byte is an instruction's");
        assert_eq!(inside(0x1004), Some(0x1000));
        assert_eq!(inside(0x1005), None, "past its end");
        assert_eq!(inside(0x1ff1), Some(0x1ff0));
        assert_eq!(inside(0x9000), None);
        assert_eq!(inside(0x10), None);
    }

    #[test]
    fn runs_found_at_the_attach_are_not_the_runtime_s() {
        let before = vec![Run {
            addr: 0x100,
            file: vec![1, 2, 3],
            now: vec![9, 9, 9],
        }];
        let same = Run {
            addr: 0x101,
            file: vec![2],
            now: vec![9],
        };
        let changed = Run {
            addr: 0x101,
            file: vec![2],
            now: vec![8],
        };
        let elsewhere = Run {
            addr: 0x200,
            file: vec![2],
            now: vec![9],
        };
        assert_eq!(
            new_since(&before, vec![same, changed.clone(), elsewhere.clone()]),
            vec![changed, elsewhere]
        );
    }
}
