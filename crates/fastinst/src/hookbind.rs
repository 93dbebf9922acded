//! The `-finstrument-functions` hook slots of libraries a process loads
//! while attached.
//!
//! `fastinst attach` points the hook slots of the modules mapped at the
//! attach at the runtime's hooks. A library the process loads later has
//! its slots bound by the loader to the C library's hooks, which do
//! nothing, so its calls would never reach the runtime. The sled watcher
//! calls [`bind_new`] when modules were loaded, which points the new
//! modules' slots at the runtime's hooks from inside the process: one
//! aligned 8-byte store each, which a thread calling through the slot
//! sees whole (the old hook or the new; a call whose entry went to the
//! old one and exit to the new is a call in flight, as at the attach). A
//! slot inside the module's RELRO range is on a page the loader made
//! read-only: it is made writable for the store and read-only again. The
//! detach (the command) reads the same slots from the file and puts back
//! the C library's hooks.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// The first module index whose slots are not done (bound here, or by the
/// command for the modules mapped at the attach): a module read gets the
/// next index, so every later one is new.
static FROM: AtomicU32 = AtomicU32::new(0);

/// Marks every module mapped now as done: the attaching command bound
/// their slots. Called at each attach's start.
pub(crate) fn mark_mapped() {
    let next = crate::discovery::with_state(|s| {
        s.rescan();
        s.modules.loaded.iter().map(|m| m.index + 1).max().unwrap_or(0)
    });
    FROM.fetch_max(next, Ordering::AcqRel);
}

/// Binds the hook slots of the modules mapped since [`mark_mapped`] to
/// the runtime's hooks; returns how many slots it bound.
pub(crate) fn bind_new() -> usize {
    let from = FROM.load(Ordering::Acquire);
    let new: Vec<_> =
        crate::discovery::with_state(|s| s.modules.loaded.iter().filter(|m| m.index >= from).cloned().collect());
    let hooks = crate::hooks::hooks();
    let mut bound = 0;
    for m in new {
        let providers::hookslots::ModuleSlots { slots, relro } = m.hook_slots();
        let mut here = 0;
        for s in &slots {
            let to = if s.hook == 0 { hooks.enter } else { hooks.exit };
            here += usize::from(store(s.addr, to, relro));
        }
        if !slots.is_empty() {
            crate::log::info(format_args!(
                "{here} of the {} -finstrument-functions hook slots of {} bound (loaded while attached)",
                slots.len(),
                m.path
            ));
        }
        bound += here;
        FROM.fetch_max(m.index + 1, Ordering::AcqRel);
    }
    bound
}

/// Stores `value` in the GOT slot at `slot`, making its page writable for
/// the store where it lies in `relro`; false if it could not.
fn store(slot: u64, value: u64, relro: Option<(u64, u64)>) -> bool {
    if !slot.is_multiple_of(8) {
        return false;
    }
    let page = (slot & !(wordpatch::PAGE_SIZE as u64 - 1)) as *mut libc::c_void;
    let protected = relro.is_some_and(|(a, b)| (a..b).contains(&slot));
    // SAFETY: the page holds a GOT slot of a loaded module (from its
    // dynamic relocations), read-only only as RELRO; write is added for
    // the store alone.
    if protected && unsafe { libc::mprotect(page, wordpatch::PAGE_SIZE, libc::PROT_READ | libc::PROT_WRITE) } != 0 {
        return false;
    }
    // SAFETY: an 8-byte aligned GOT slot of a loaded module, writable now;
    // the loader and every caller read it as one word.
    unsafe { AtomicU64::from_ptr(slot as *mut u64).store(value, Ordering::Release) };
    if protected {
        // SAFETY: as above: the page's RELRO protection, as the loader left it.
        unsafe { libc::mprotect(page, wordpatch::PAGE_SIZE, libc::PROT_READ) };
    }
    true
}
