//! The insert-only set of every site that has ever been patched as a straddler.
//!
//! A core may fetch a stale INT3 for up to T_max after a patch has finished and
//! left the in-flight table. The SIGTRAP handler then finds no patch in flight
//! but the site in this set with a byte that is no longer INT3: the trap was
//! ours, and re-executing the site is correct. Without the set such a trap
//! could not be told from the application's own `int3`.

use crate::error::Error;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Capacity of the set: distinct straddling sites a process may patch.
pub const MAX_STRADDLER_SITES: usize = 1 << 17;
const PROBES: usize = 512;
static SET: [AtomicUsize; MAX_STRADDLER_SITES] = [const { AtomicUsize::new(0) }; MAX_STRADDLER_SITES];

fn home(site: usize) -> usize {
    (site.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 47) % MAX_STRADDLER_SITES
}

/// Adds `site` (lock-free; idempotent).
pub(crate) fn insert(site: usize) -> Result<(), Error> {
    let h = home(site);
    for k in 0..PROBES {
        let slot = &SET[(h + k) % MAX_STRADDLER_SITES];
        match slot.load(Ordering::Acquire) {
            s if s == site => return Ok(()),
            0 => match slot.compare_exchange(0, site, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Ok(()),
                Err(s) if s == site => return Ok(()),
                Err(_) => {}
            },
            _ => {}
        }
    }
    Err(Error::TooManyStraddlerSites {
        limit: MAX_STRADDLER_SITES,
    })
}

/// True when `site` was ever inserted. Async-signal-safe: atomic loads only.
pub(crate) fn contains(site: usize) -> bool {
    let h = home(site);
    for k in 0..PROBES {
        match SET[(h + k) % MAX_STRADDLER_SITES].load(Ordering::Acquire) {
            s if s == site => return true,
            0 => return false,
            _ => {}
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_then_contains() {
        let base = 0x7777_0000_0000usize;
        for i in 0..1000 {
            insert(base + 61 + 64 * i).unwrap();
        }
        for i in 0..1000 {
            assert!(contains(base + 61 + 64 * i));
            assert!(!contains(base + 60 + 64 * i));
        }
        insert(base + 61).unwrap();
    }
}
