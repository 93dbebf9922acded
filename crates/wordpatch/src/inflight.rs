//! The table of straddling patches in flight, and the state machine that moves
//! each through the paper's protocol (Fig. 6-7):
//!
//! ```text
//! claim slot ─► xchg INT3 ─► FIRST_WAIT ─(wait)─► write back part ─► SECOND_WAIT
//!                                        ─(wait)─► write front part (unlocks) ─► FINISHED (slot freed)
//! ```
//!
//! Slots are found by hashing the cache-line boundary a patch crosses. Two
//! straddling patches of at most 8 bytes overlap exactly when they cross the
//! same boundary, so overlap detection is a scan of one short window.
//!
//! Anyone may advance a patch: its patcher, [`flush`](crate::flush), the
//! background [`Finisher`](crate::Finisher), or a thread that trapped on its
//! INT3. Each step is taken under the slot's try-lock and only once its wait
//! has elapsed since the previous step, so who takes it does not matter; a
//! patch therefore completes even if its patcher is descheduled, and a thread
//! that runs into its own pending patch does not deadlock. Everything here is
//! async-signal-safe: atomics, `rdtsc`, locked stores, and `membarrier`.

use crate::error::Error;
use crate::geometry::{line_start, CACHE_LINE};
use crate::raw;
use crate::tsc;
use crate::wait::{self, Wait};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};

/// Number of slots.
pub const SLOTS: usize = 4096;
/// Slots probed around a boundary's home slot: at most this many straddlers
/// whose boundaries hash near each other may be in flight at once.
const WINDOW: usize = 32;

const FIRST_WAIT: u8 = 1;
const SECOND_WAIT: u8 = 2;
/// `wait` value meaning [`Wait::SyncCore`].
const SYNC: u64 = u64::MAX;
pub(crate) const INT3: u8 = 0xCC;
/// Ticks a trapped thread waits on a SyncCore patch before it runs barriers
/// itself (~40 µs at 2.6 GHz: well above one barrier round trip).
const HELP_BARRIER_AFTER: u64 = 100_000;

struct Slot {
    /// Site address; 0 while free.
    site: AtomicUsize,
    /// Bumped whenever the slot is freed: (index, seq) names one patch.
    seq: AtomicU64,
    /// Held while someone advances the patch. Free slots stay locked, so only
    /// the claimer can touch a slot until it publishes it.
    lock: AtomicBool,
    state: AtomicU8,
    len: AtomicU8,
    bytes: AtomicU64,
    /// TSC of the last step, or the barrier generation for SyncCore.
    stamp: AtomicU64,
    /// T_max ticks, or SYNC.
    wait: AtomicU64,
    /// TSC when the INT3 lock was published and when the back part was
    /// written; kept for [`diagnose`] (crash reports, calibration).
    t_lock: AtomicU64,
    t_back: AtomicU64,
    /// Whether the back part was written by a thread in the SIGTRAP handler.
    back_by_trap: AtomicBool,
}

impl Slot {
    const fn new() -> Self {
        Slot {
            site: AtomicUsize::new(0),
            seq: AtomicU64::new(0),
            lock: AtomicBool::new(true),
            state: AtomicU8::new(0),
            len: AtomicU8::new(0),
            bytes: AtomicU64::new(0),
            stamp: AtomicU64::new(0),
            wait: AtomicU64::new(0),
            t_lock: AtomicU64::new(0),
            t_back: AtomicU64::new(0),
            back_by_trap: AtomicBool::new(false),
        }
    }
}

static TABLE: [Slot; SLOTS] = [const { Slot::new() }; SLOTS];
static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);

/// One claimed patch: its slot index, the slot's sequence number and its
/// site.
///
/// The site is part of the name because a slot is freed in two stores,
/// `seq += 1` and then `site = 0`: a lookup between the two reads the site
/// and the *next* sequence number, which names no patch. Such a ticket
/// must die when the site is cleared, not live on while the freed slot
/// waits, locked, for its next claim: a thread trapped on the site would
/// help that ticket forever (it hung CI once, with all toggling over).
/// With the site in the name, that ticket is dead once `site = 0`, and if
/// the slot is claimed again for the same site, its sequence number is the
/// new patch's, so the ticket names that patch correctly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ticket {
    idx: usize,
    seq: u64,
    site: usize,
}

/// What an attempt to advance a patch achieved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// The patch is complete (by us or someone else).
    Done,
    /// Its wait has not elapsed yet, or we just took a step.
    Waiting,
    /// Someone else holds the slot right now.
    Busy,
}

fn boundary_of(site: usize) -> usize {
    line_start(site) + CACHE_LINE
}

fn window(boundary: usize) -> impl Iterator<Item = usize> {
    let home = ((boundary / CACHE_LINE).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 52) % SLOTS;
    (0..WINDOW).map(move |k| (home + k) % SLOTS)
}

fn encode(w: Wait) -> u64 {
    match w {
        Wait::Tmax(t) => t.min(SYNC - 1),
        Wait::SyncCore => SYNC,
    }
}

/// Number of straddling patches in flight.
pub fn pending() -> usize {
    IN_FLIGHT.load(Ordering::SeqCst)
}

/// Claims a slot for a straddling patch and checks no other patch in flight
/// crosses the same boundary. The slot stays locked and unpublished until
/// [`publish`] (after the INT3 lock succeeded) or [`abandon`].
pub(crate) fn claim(site: usize, new: &[u8], w: Wait) -> Result<Ticket, Error> {
    let boundary = boundary_of(site);
    let mut bytes = [0u8; 8];
    bytes[..new.len()].copy_from_slice(new);
    for idx in window(boundary) {
        let slot = &TABLE[idx];
        if slot.site.load(Ordering::Relaxed) != 0
            || slot
                .site
                .compare_exchange(0, site, Ordering::SeqCst, Ordering::Relaxed)
                .is_err()
        {
            continue;
        }
        slot.len.store(new.len() as u8, Ordering::Relaxed);
        slot.bytes.store(u64::from_le_bytes(bytes), Ordering::Relaxed);
        slot.wait.store(encode(w), Ordering::Relaxed);
        slot.state.store(FIRST_WAIT, Ordering::Relaxed);
        let t = Ticket {
            idx,
            seq: slot.seq.load(Ordering::Relaxed),
            site,
        };
        IN_FLIGHT.fetch_add(1, Ordering::SeqCst);
        // Same-site rivals are settled by the INT3 exchange, so that one of
        // them always wins; a different site on the same boundary overlaps.
        for j in window(boundary) {
            let other = TABLE[j].site.load(Ordering::SeqCst);
            if j != idx && other != 0 && other != site && boundary_of(other) == boundary {
                abandon(t);
                return Err(Error::OverlapInFlight { site, other });
            }
        }
        return Ok(t);
    }
    Err(Error::TooManyInFlight { site })
}

/// In a fork child, before it runs anything else of this crate: the
/// patches the parent's other threads had in flight have no patcher here,
/// and a slot one of them held locked would stay locked for good, so a
/// thread trapped on its INT3 would wait forever. Each is finished (its
/// INT3 in place: the rest of its bytes written; the child has one thread,
/// so no wait is due) or dropped (no INT3: not begun, or its bytes all
/// written), and its slot freed.
pub(crate) fn repair_after_fork() {
    if IN_FLIGHT.load(Ordering::SeqCst) == 0 {
        return;
    }
    for slot in &TABLE {
        let site = slot.site.load(Ordering::Acquire);
        if site == 0 {
            continue;
        }
        // SAFETY: a site in the table is mapped code.
        if unsafe { raw::load_u8(site) } == INT3 {
            let len = slot.len.load(Ordering::Relaxed) as usize;
            let bytes = slot.bytes.load(Ordering::Relaxed).to_le_bytes();
            if slot.state.load(Ordering::Relaxed) == FIRST_WAIT {
                write_back(site, len, bytes);
            }
            write_front(site, bytes);
        }
        slot.lock.store(true, Ordering::Relaxed);
        slot.seq.fetch_add(1, Ordering::SeqCst);
        slot.site.store(0, Ordering::SeqCst);
        IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Frees a claimed slot whose INT3 lock was not taken (or was given back).
pub(crate) fn abandon(t: Ticket) {
    let slot = &TABLE[t.idx];
    slot.seq.fetch_add(1, Ordering::SeqCst);
    slot.site.store(0, Ordering::SeqCst);
    IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
}

/// Starts the first wait of a claimed patch whose INT3 is now in place.
pub(crate) fn publish(t: Ticket) {
    let slot = &TABLE[t.idx];
    let now = tsc::now_ordered();
    let stamp = if slot.wait.load(Ordering::Relaxed) == SYNC {
        wait::sync_stamp()
    } else {
        now
    };
    slot.stamp.store(stamp, Ordering::Relaxed);
    slot.t_lock.store(now, Ordering::Relaxed);
    slot.t_back.store(0, Ordering::Relaxed);
    slot.lock.store(false, Ordering::Release);
}

/// Where the patch at `t` is and when its current wait ends (TSC), for a
/// patcher that wants to sleep-spin instead of hammering the slot.
pub(crate) fn deadline(t: Ticket) -> Option<u64> {
    let slot = &TABLE[t.idx];
    let w = slot.wait.load(Ordering::Relaxed);
    (w != SYNC).then(|| slot.stamp.load(Ordering::Relaxed).wrapping_add(w))
}

/// True while the patch named by `t` is in flight.
pub(crate) fn live(t: Ticket) -> bool {
    let slot = &TABLE[t.idx];
    slot.seq.load(Ordering::Acquire) == t.seq && slot.site.load(Ordering::Acquire) == t.site
}

fn write_back(site: usize, len: usize, bytes: [u8; 8]) {
    let split = CACHE_LINE - site % CACHE_LINE;
    // SAFETY: the site's pages were made writable before the patch was
    // claimed; the back part lies inside the line after the boundary.
    let _ = unsafe { raw::store_in_line((site + split) as *mut u8, &bytes[split..len], None) };
}

fn write_front(site: usize, bytes: [u8; 8]) {
    let split = CACHE_LINE - site % CACHE_LINE;
    // SAFETY: as in write_back; the front part ends at the boundary. Its first
    // byte replaces our INT3, which releases the site.
    let _ = unsafe { raw::store_in_line(site as *mut u8, &bytes[..split], None) };
}

/// Tries to take the next step of the patch `t`. With `may_sync`, a SyncCore
/// patch whose barrier is due runs the barrier itself (blocking ~µs).
pub(crate) fn advance(t: Ticket, may_sync: bool) -> Step {
    advance_from(t, may_sync, false)
}

fn advance_from(t: Ticket, may_sync: bool, in_trap: bool) -> Step {
    let slot = &TABLE[t.idx];
    if !live(t) {
        return Step::Done;
    }
    // Pollers and trapped helpers call this in loops: look before locking, so
    // that waiting costs plain loads instead of RMWs that bounce the slot's
    // line between cores. (The locked re-check below decides.)
    // A step is due for this caller once its wait has elapsed, or, for a
    // SyncCore patch, when the caller may run the barrier itself.
    let w = slot.wait.load(Ordering::Relaxed);
    let stamp = slot.stamp.load(Ordering::Acquire);
    let due = if w == SYNC {
        may_sync || wait::synced_since(stamp)
    } else {
        tsc::elapsed_since(stamp) >= w
    };
    if slot.lock.load(Ordering::Relaxed) || !due {
        return if live(t) { Step::Waiting } else { Step::Done };
    }
    if slot
        .lock
        .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        return if live(t) { Step::Busy } else { Step::Done };
    }
    if !live(t) {
        // The slot was freed and claimed again by another patch.
        slot.lock.store(false, Ordering::Release);
        return Step::Done;
    }
    let w = slot.wait.load(Ordering::Relaxed);
    let stamp = slot.stamp.load(Ordering::Relaxed);
    let ready = if w == SYNC {
        if !wait::synced_since(stamp) && may_sync {
            wait::sync_core();
        }
        wait::synced_since(stamp)
    } else {
        // The TSC must be read after the stamp was loaded (`now_ordered`), and
        // a stamp from another core that is still ahead of our reading must
        // mean "not yet": unsigned wrap-around would turn it into "elapsed
        // long ago" and write the next step at once. The stress harness
        // caught exactly that as rare torn straddlers at every wait.
        tsc::elapsed_since(stamp) >= w
    };
    if !ready {
        slot.lock.store(false, Ordering::Release);
        return Step::Waiting;
    }
    let site = slot.site.load(Ordering::Relaxed);
    let len = slot.len.load(Ordering::Relaxed) as usize;
    let bytes = slot.bytes.load(Ordering::Relaxed).to_le_bytes();
    match slot.state.load(Ordering::Relaxed) {
        FIRST_WAIT => {
            write_back(site, len, bytes);
            let now = tsc::now_ordered();
            let stamp = if w == SYNC { wait::sync_stamp() } else { now };
            slot.stamp.store(stamp, Ordering::Relaxed);
            slot.t_back.store(now, Ordering::Relaxed);
            slot.back_by_trap.store(in_trap, Ordering::Relaxed);
            slot.state.store(SECOND_WAIT, Ordering::Relaxed);
            slot.lock.store(false, Ordering::Release);
            Step::Waiting
        }
        _ => {
            write_front(site, bytes);
            // The slot stays locked: free slots are locked.
            slot.seq.fetch_add(1, Ordering::SeqCst);
            slot.site.store(0, Ordering::SeqCst);
            IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
            Step::Done
        }
    }
}

/// The patch in flight at exactly `site`, if any.
pub(crate) fn find(site: usize) -> Option<Ticket> {
    for idx in window(boundary_of(site)) {
        let slot = &TABLE[idx];
        if slot.site.load(Ordering::Acquire) == site {
            let seq = slot.seq.load(Ordering::Acquire);
            if slot.site.load(Ordering::Acquire) == site {
                return Some(Ticket { idx, seq, site });
            }
        }
    }
    None
}

/// A patch in flight that overlaps `len` bytes at `addr` (which must not
/// straddle), if any. Costs one load when nothing is in flight.
pub(crate) fn overlapping(addr: usize, len: usize) -> Option<usize> {
    if IN_FLIGHT.load(Ordering::SeqCst) == 0 {
        return None;
    }
    // A straddler overlapping a range in line L crosses L's start or L's end.
    for boundary in [line_start(addr), line_start(addr) + CACHE_LINE] {
        for idx in window(boundary) {
            let slot = &TABLE[idx];
            let s = slot.site.load(Ordering::SeqCst);
            if s == 0 || boundary_of(s) != boundary {
                continue;
            }
            // A slot being claimed may not show its length yet: assume the most.
            let l = match slot.len.load(Ordering::SeqCst) as usize {
                0 => 8,
                l => l,
            };
            if s < addr + len && addr < s + l {
                return Some(s);
            }
        }
    }
    None
}

/// Every patch in flight, as tickets, for a finishing pass.
pub(crate) fn for_each_in_flight(mut f: impl FnMut(Ticket, bool)) {
    if IN_FLIGHT.load(Ordering::SeqCst) == 0 {
        return;
    }
    for (idx, slot) in TABLE.iter().enumerate() {
        let site = slot.site.load(Ordering::Acquire);
        if site == 0 {
            continue;
        }
        let seq = slot.seq.load(Ordering::Acquire);
        let sync = slot.wait.load(Ordering::Relaxed) == SYNC;
        f(Ticket { idx, seq, site }, sync);
    }
}

/// Called by the SIGTRAP handler for an INT3 at `site`: if the trap is ours,
/// helps the patch to completion, returns true, and the handler re-executes
/// the site. Returns false for a trap that is not ours.
pub(crate) fn wait_out(site: usize) -> bool {
    loop {
        if let Some(t) = find(site) {
            // Help without barriers first: a running patcher issues them, and
            // every trapped thread firing its own SYNC_CORE IPIs would slow
            // everyone. Only a patch that stalls (patcher descheduled, or this
            // thread ran into its own async patch) gets barriers from here.
            let since = tsc::now();
            while advance_from(t, tsc::elapsed_since(since) > HELP_BARRIER_AFTER, true) != Step::Done {
                core::hint::spin_loop();
            }
            return true;
        }
        if !crate::sites::contains(site) {
            return false;
        }
        // SAFETY: `site` was just executed, so it is mapped and readable.
        if unsafe { raw::load_u8(site) } != INT3 {
            // A stale INT3 of a finished patch: the new code is in place.
            return true;
        }
        // INT3 present but its slot not visible yet: the patcher is between
        // claiming and publishing. Look again.
        core::hint::spin_loop();
    }
}

/// What the table knows about the straddling patch in flight at `site`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotDiagnosis {
    /// 1: waiting to write the back part; 2: waiting to write the front part.
    pub state: u8,
    /// TSC when the INT3 lock was taken (published).
    pub t_lock: u64,
    /// TSC when the back part was written (0: not yet).
    pub t_back: u64,
    /// The wait in ticks (`u64::MAX` for SyncCore).
    pub wait: u64,
    /// Whether a thread in the SIGTRAP handler wrote the back part.
    pub back_by_trap: bool,
}

/// The patch in flight at `site`, for crash reporters and calibration.
/// Async-signal-safe (atomic loads only); a racy snapshot.
pub fn diagnose(site: *const u8) -> Option<SlotDiagnosis> {
    let t = find(site as usize)?;
    let slot = &TABLE[t.idx];
    Some(SlotDiagnosis {
        state: slot.state.load(Ordering::Relaxed),
        t_lock: slot.t_lock.load(Ordering::Relaxed),
        t_back: slot.t_back.load(Ordering::Relaxed),
        wait: slot.wait.load(Ordering::Relaxed),
        back_by_trap: slot.back_by_trap.load(Ordering::Relaxed),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Boundaries (far from any real mapping: the table never touches the
    /// addresses) whose slot windows start at the same home slot.
    fn colliding_boundaries(n: usize) -> Vec<usize> {
        let base = 0x6666_0000_0000usize;
        let home = |b: usize| window(b).next().unwrap();
        let target = home(base);
        (0..)
            .map(|k| base + k * CACHE_LINE)
            .filter(|&b| home(b) == target)
            .take(n)
            .collect()
    }

    /// Takes the first step of freeing `t`'s published slot, as
    /// `advance_from`'s last step does (the slot stays locked): `seq += 1`,
    /// with `site = 0` still to come.
    fn begin_release(t: Ticket) -> &'static Slot {
        let slot = &TABLE[t.idx];
        assert!(slot
            .lock
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok());
        slot.seq.fetch_add(1, Ordering::SeqCst);
        slot
    }

    /// The interleaving that hung a trapped thread: a lookup that lands
    /// between the two stores that free a slot gets the site and the next
    /// sequence number. That ticket must be dead once the site is cleared
    /// (before the fix it stayed live, and helping it returned `Waiting`
    /// forever on the freed, locked slot), and must name the next patch if
    /// the same site claims the slot again.
    #[test]
    fn a_lookup_racing_the_release_never_names_a_free_slot() {
        let site = 0x6888_0000_0000usize - 2;
        let t = claim(site, &[1, 2, 3, 4], Wait::Tmax(0)).unwrap();
        publish(t);
        let slot = begin_release(t);
        let raced = find(site).expect("the site is still visible");
        assert_ne!(raced, t);
        // The second store.
        slot.site.store(0, Ordering::SeqCst);
        IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
        assert!(!live(raced));
        assert_eq!(advance(raced, false), Step::Done);
        // Claimed again for the same site: the raced ticket is that patch.
        let again = claim(site, &[5, 6, 7, 8], Wait::Tmax(0)).unwrap();
        assert_eq!(again, raced);
        assert!(live(raced));
        abandon(again);
        assert!(!live(raced));
    }

    /// A patch finishes (its slot between `seq += 1` and `site = 0`) while
    /// the next patch at the same site already holds another slot. Finishing
    /// the site must not answer `Done` because the slot it looked up first
    /// was the finished one: the new patch is still in flight. (Before the
    /// fix it did, and the next `start_patch` found the site INT3-locked.)
    #[test]
    fn finishing_a_site_looks_past_a_slot_that_is_being_freed() {
        let site = 0x6999_0000_0000usize - 2;
        let a = claim(site, &[1, 2, 3, 4], Wait::Tmax(0)).unwrap();
        publish(a);
        let slot = begin_release(a);
        // The next patch: its INT3 is in and its wait far from over.
        let b = claim(site, &[5, 6, 7, 8], Wait::Tmax(u64::MAX / 2)).unwrap();
        publish(b);
        assert_ne!(a.idx, b.idx);
        let stale = find(site).expect("the finishing slot still names the site");
        assert_eq!(stale.idx, a.idx, "the window hands out the finishing slot first");
        let mut first = true;
        let progress = crate::patch::finish_found(site, |s| {
            if std::mem::take(&mut first) {
                // The release's second store lands between lookup and step.
                slot.site.store(0, Ordering::SeqCst);
                IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
                Some(stale)
            } else {
                find(s)
            }
        });
        assert_eq!(progress, crate::Progress::InFlight, "the second patch is in flight");
        assert_eq!(find(site), Some(b));
        abandon(b);
        assert_eq!(crate::finish_patch(site as *const u8), crate::Progress::Done);
    }

    #[test]
    fn a_full_window_is_too_many_in_flight() {
        let bs = colliding_boundaries(WINDOW + 1);
        let mut tickets = Vec::new();
        for &b in &bs[..WINDOW] {
            tickets.push(claim(b - 2, &[1, 2, 3, 4], Wait::Tmax(0)).expect("slot"));
        }
        let last = bs[WINDOW];
        assert_eq!(
            claim(last - 2, &[1, 2, 3, 4], Wait::Tmax(0)),
            Err(Error::TooManyInFlight { site: last - 2 })
        );
        for t in tickets {
            abandon(t);
        }
        let t = claim(last - 2, &[1, 2, 3, 4], Wait::Tmax(0)).expect("a slot after the others left");
        abandon(t);
    }

    #[test]
    fn same_boundary_other_site_overlaps_same_site_is_left_to_int3() {
        let b = 0x6777_0000_0000usize;
        let a = claim(b - 3, &[1, 2, 3, 4, 5], Wait::Tmax(0)).unwrap();
        assert_eq!(
            claim(b - 1, &[1, 2], Wait::Tmax(0)),
            Err(Error::OverlapInFlight {
                site: b - 1,
                other: b - 3
            })
        );
        // The same site may be claimed twice: the INT3 exchange picks the winner.
        let twin = claim(b - 3, &[9, 9, 9, 9, 9], Wait::Tmax(0)).unwrap();
        assert_eq!(find(b - 3).map(|t| t.idx == a.idx || t.idx == twin.idx), Some(true));
        assert_eq!(overlapping(b + 1, 1), Some(b - 3), "back part of the line after");
        assert_eq!(overlapping(b - 8, 5), None, "disjoint bytes before the site");
        abandon(twin);
        abandon(a);
        assert_eq!(find(b - 3), None);
        assert!(!live(a));
    }
}
