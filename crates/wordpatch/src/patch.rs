//! The public patching operations: synchronous [`patch`], asynchronous
//! [`start_patch`] / [`finish_patch`], and [`flush`].

use crate::default_wait::default_wait_copy;
use crate::error::Error;
use crate::geometry::{is_straddler, MAX_PATCH_LEN};
use crate::inflight::{self, Step, Ticket, INT3};
use crate::raw;
use crate::sites;
use crate::trap::ensure_installed;
use crate::tsc;
use crate::wait::{ensure_sync_core, Wait};
use crate::writable::make_writable;

/// Options of one patch.
#[derive(Clone, Copy, Debug, Default)]
pub struct PatchOptions<'a> {
    /// The bytes the caller says the site holds now; the patch is refused with
    /// [`Error::Unexpected`] if it holds others. For a non-straddler the check
    /// and the store are one atomic operation.
    pub expected: Option<&'a [u8]>,
    /// Wait strategy for a straddling patch; `None` takes [`default_wait`](crate::default_wait).
    pub wait: Option<Wait>,
}

/// State of an asynchronous patch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress {
    /// The new bytes are in place.
    Done,
    /// A straddling patch is between its steps: drive it with
    /// [`finish_patch`], [`flush`] or a [`Finisher`](crate::Finisher).
    InFlight,
}

enum Started {
    Done,
    InFlight(Ticket),
}

/// Replaces the `new.len()` (1..=8) bytes at `site` with `new` while other
/// threads may be executing them, returning once the new bytes are in place.
///
/// A patch inside one cache line is one atomic store. A straddling patch takes
/// the INT3 lock on the site, waits, writes the part after the line boundary,
/// waits, and writes the part before it (paper §5); threads that reach the
/// site meanwhile wait in the SIGTRAP handler.
///
/// # Safety
/// `site` is the first byte of an instruction (or of a run of instructions
/// the caller replaces whole); the old and new bytes are each valid code at
/// that address with the same instruction boundaries after the patch, and no
/// thread is stopped inside the replaced bytes. No other patch of a partially
/// overlapping range runs concurrently (detected for straddlers in flight).
pub unsafe fn patch(site: *mut u8, new: &[u8]) -> Result<(), Error> {
    // SAFETY: forwarded contract.
    unsafe { patch_with(site, new, &PatchOptions::default()) }
}

/// [`patch`] with options.
///
/// # Safety
/// As for [`patch`].
pub unsafe fn patch_with(site: *mut u8, new: &[u8], opts: &PatchOptions<'_>) -> Result<(), Error> {
    // SAFETY: forwarded contract.
    match unsafe { start(site, new, opts)? } {
        Started::Done => Ok(()),
        Started::InFlight(t) => {
            drive(t);
            Ok(())
        }
    }
}

/// Starts a patch and returns without waiting (paper Fig. 6): a non-straddler
/// is done at once; a straddler is INT3-locked and left in
/// [`Progress::InFlight`] for [`finish_patch`], [`flush`] or a
/// [`Finisher`](crate::Finisher) to complete. One thread may keep many
/// patches in flight.
///
/// # Safety
/// As for [`patch`]; in addition the caller must see to it that the patch is
/// finished (threads reaching the site meanwhile help finish it, so a patch
/// left alone still completes once the site is executed).
pub unsafe fn start_patch(site: *mut u8, new: &[u8], opts: &PatchOptions<'_>) -> Result<Progress, Error> {
    // SAFETY: forwarded contract.
    Ok(match unsafe { start(site, new, opts)? } {
        Started::Done => Progress::Done,
        Started::InFlight(_) => {
            crate::wakeup::wake();
            Progress::InFlight
        }
    })
}

/// Advances the patch in flight at `site` by at most one step if its wait has
/// elapsed (paper Fig. 7); `Done` once it is complete or if no patch is in
/// flight there. With [`Wait::SyncCore`] a due step runs its barrier here.
pub fn finish_patch(site: *const u8) -> Progress {
    finish_found(site as usize, inflight::find)
}

/// Lookups [`finish_patch`] makes past slots that turn out finished before
/// it answers `InFlight` (the caller polls again).
const FINISH_LOOKUPS: usize = 4;

/// [`finish_patch`] with its slot lookup as a parameter, so a test can hand
/// it the slot of a patch that finishes between the lookup and the step.
///
/// `Done` only once no slot names the site. A "Done" from the slot found is
/// not enough: a finished patch's slot still names its site until the last
/// store of its release, and a patch started at the same site in that moment
/// holds another slot; the lookup may hand out the finishing one first. When
/// this answered `Done` for it, a caller that polled a patch to completion
/// and started the next one found the site still INT3-locked by the patch
/// it believed finished (the stress harness's `word-async` toggle errors).
pub(crate) fn finish_found(site: usize, mut find: impl FnMut(usize) -> Option<Ticket>) -> Progress {
    for _ in 0..FINISH_LOOKUPS {
        match find(site) {
            None => return Progress::Done,
            Some(t) => match inflight::advance(t, true) {
                Step::Done => continue,
                Step::Waiting | Step::Busy => return Progress::InFlight,
            },
        }
    }
    Progress::InFlight
}

/// Drives every patch in flight to completion and returns how many this call
/// completed. Waits are shared: patches started together finish in about two
/// waits in all, and SyncCore patches share each barrier.
pub fn flush() -> usize {
    let mut done = 0;
    while inflight::pending() > 0 {
        done += flush_pass();
        core::hint::spin_loop();
    }
    done
}

/// One pass over the table: advances every patch whose wait has elapsed and
/// runs at most one barrier for all SyncCore patches that need one.
pub(crate) fn flush_pass() -> usize {
    let mut done = 0;
    let mut need_sync = false;
    inflight::for_each_in_flight(|t, sync| match inflight::advance(t, false) {
        Step::Done => done += 1,
        Step::Waiting if sync => need_sync = true,
        _ => {}
    });
    if need_sync {
        crate::wait::sync_core();
    }
    done
}

/// Number of straddling patches in flight.
pub fn pending() -> usize {
    inflight::pending()
}

fn drive(t: Ticket) {
    loop {
        match inflight::advance(t, true) {
            Step::Done => return,
            Step::Waiting => {
                if let Some(deadline) = inflight::deadline(t) {
                    while inflight::live(t) && (tsc::now().wrapping_sub(deadline) as i64) < 0 {
                        core::hint::spin_loop();
                    }
                }
            }
            Step::Busy => core::hint::spin_loop(),
        }
    }
}

fn unexpected(site: usize, found: &[u8], expected: &[u8]) -> Error {
    Error::Unexpected {
        site,
        found: crate::CodeBytes::new(found),
        expected: crate::CodeBytes::new(expected),
    }
}

/// # Safety
/// As for [`patch`].
unsafe fn start(site: *mut u8, new: &[u8], opts: &PatchOptions<'_>) -> Result<Started, Error> {
    let addr = site as usize;
    let len = new.len();
    if !(1..=MAX_PATCH_LEN).contains(&len) {
        return Err(Error::InvalidLength(len));
    }
    if let Some(e) = opts.expected {
        if e.len() != len {
            return Err(Error::InvalidLength(e.len()));
        }
    }
    make_writable(site, len)?;

    if !is_straddler(addr, len) {
        if let Some(other) = inflight::overlapping(addr, len) {
            return Err(Error::OverlapInFlight { site: addr, other });
        }
        // SAFETY: the range is inside one line and writable (above); the
        // caller vouches for the bytes.
        return match unsafe { raw::store_in_line(site, new, opts.expected) } {
            Ok(_) => Ok(Started::Done),
            Err(m) => Err(unexpected(addr, &m.found[..len], opts.expected.unwrap_or(&[]))),
        };
    }

    if new[0] == INT3 {
        return Err(Error::StartsWithInt3 { site: addr });
    }
    let wait = match opts.wait.or_else(default_wait_copy) {
        Some(w) => w,
        None => return Err(Error::NoProvenWait { site: addr }),
    };
    if wait == Wait::SyncCore {
        ensure_sync_core()?;
    }
    ensure_installed()?;
    sites::insert(addr)?;
    // A fork child must not inherit a patch half done.
    crate::fork::install_handlers();
    let t = inflight::claim(addr, new, wait)?;
    // SAFETY: the site is writable (above). From here threads reaching the
    // site trap and wait in the handler, which finds our claimed slot.
    let old0 = unsafe { raw::xchg_u8(addr, INT3) };
    if old0 == INT3 {
        inflight::abandon(t);
        return Err(Error::SiteLocked { site: addr });
    }
    if let Some(e) = opts.expected {
        // The INT3 lock keeps other patchers off the site, so this read is stable.
        let mut cur = [0u8; MAX_PATCH_LEN];
        // SAFETY: the range is mapped (made writable above).
        unsafe { raw::read_code(site, &mut cur[..len]) };
        cur[0] = old0;
        if cur[..len] != *e {
            // SAFETY: we hold the lock; putting the old byte back releases it.
            unsafe { raw::xchg_u8(addr, old0) };
            inflight::abandon(t);
            return Err(unexpected(addr, &cur[..len], e));
        }
    }
    inflight::publish(t);
    Ok(Started::InFlight(t))
}
