//! Writing a site's code: the state bits a probe or sled keeps for it,
//! the strategy new deactivations use, and the wordpatch store every
//! word strategy goes through.

use crate::error::{Error, Result};
use crate::probe::{ProbeId, Strategy};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;
use wordpatch::{PatchOptions, Progress};

/// The code-state bit of a probe or sled: set while its code calls the
/// hook; clear, the low bits say which strategy switched it off.
pub(crate) const ON: u8 = 0x80;

static STRATEGY: AtomicU8 = AtomicU8::new(Strategy::Flip as u8);

/// The strategy new deactivations use.
pub fn strategy() -> Strategy {
    Strategy::from_u8(STRATEGY.load(Ordering::Relaxed))
}

/// Sets the strategy new deactivations use. A probe that is off is switched
/// back on with the inverse of the strategy that switched it off, so the
/// strategy can change at any time.
pub fn set_strategy(s: Strategy) {
    if s == Strategy::WordAsync {
        finisher();
    }
    STRATEGY.store(s as u8, Ordering::Relaxed);
}

fn finisher() {
    static F: OnceLock<Option<wordpatch::Finisher>> = OnceLock::new();
    F.get_or_init(|| match wordpatch::Finisher::spawn() {
        Ok(f) => Some(f),
        Err(e) => {
            crate::log::warn(format_args!(
                "no finisher thread ({e}): async patches finish at the next toggle or when a thread reaches them"
            ));
            None
        }
    });
}

/// Rewrites the instruction at `at` from `old` to `new` with wordpatch,
/// synchronously or (`async_`) leaving a straddler to finish later, after
/// any earlier async patch of the same site has finished.
///
/// # Safety
/// `old` and `new` are whole, valid instructions of the same length at
/// `at`, whose toggling the caller owns (it holds the lock that serialises
/// it).
pub(crate) unsafe fn word_store(id: ProbeId, at: *mut u8, new: &[u8], old: &[u8], async_: bool) -> Result<()> {
    let opts = PatchOptions {
        expected: Some(old),
        wait: None,
    };
    // A previous async patch of this site may still be in flight.
    while wordpatch::finish_patch(at) == Progress::InFlight {
        std::hint::spin_loop();
    }
    // SAFETY: forwarded contract.
    let r = unsafe {
        if async_ {
            wordpatch::start_patch(at, new, &opts).map(|_| ())
        } else {
            wordpatch::patch_with(at, new, &opts)
        }
    };
    r.map_err(|source| Error::WordPatch { id, source })
}
