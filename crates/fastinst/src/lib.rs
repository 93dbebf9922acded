//! fastinst: rapid-toggling probes for native x86-64 Linux programs.
//!
//! The runtime of the paper's libfastinst (PLDI 2016, §4 and §7). Probes are
//! the hook calls a compiler emits (`-finstrument-functions`); each becomes
//! a probe with a dense [`ProbeId`] the first time it runs, is reported to
//! the discovery callbacks ([`on_discovery`]) with its [`ProbeMeta`], and
//! can then be switched on with a handler ([`activate`]) or off
//! ([`deactivate`]) from any thread, at any time, while every thread keeps
//! running: the call instruction is rewritten in place with `callpatch` or
//! `wordpatch` ([`Strategy`]).
//!
//! The model:
//! - **Hooks** ([`hooks`]): `__cyg_profile_func_enter/exit` are two-instruction
//!   stubs into a fast path that finds the probe by a tagged id (the
//!   rewritten `this_fn` argument), or by the return address in a lock-free
//!   table, and calls its handler. No lock, allocation or system call on
//!   that path. The first call of an unknown site runs discovery.
//! - **Discovery**: recognises the site with `providers` (it must be a call
//!   or tail jump that resolves to the hook; anything else is never patched
//!   and stays on), registers the probe, rewrites the argument load where
//!   safe, and calls the callbacks.
//! - **Registry**: probes never move and are never freed; reads are
//!   lock-free. A probe in a library that is `dlclose`d is marked unloaded
//!   and never touched again.
//! - **Preload** (`libfastinst.so`): configured by `FASTINST_*` variables;
//!   see the table in the README.
//!
//! The same API is exported to C (`include/fastinst.h`).
//!
//! # Example
//!
//! Count every call of every instrumented function: each entry probe is
//! switched on with a counting handler as it is discovered, and exit
//! probes are switched off.
//!
//! ```no_run
//! use fastinst::{ProbeId, ProbeKind};
//! use std::sync::atomic::{AtomicU64, Ordering};
//!
//! static CALLS: AtomicU64 = AtomicU64::new(0);
//!
//! extern "C" fn count(_: ProbeId) {
//!     CALLS.fetch_add(1, Ordering::Relaxed);
//! }
//!
//! fn main() -> fastinst::Result<()> {
//!     fastinst::on_discovery(|m| {
//!         let _ = match m.kind {
//!             ProbeKind::Entry => fastinst::activate(m.id, count),
//!             ProbeKind::Exit => fastinst::deactivate(m.id),
//!         };
//!     })?;
//!     // ... the program's instrumented code runs here ...
//!     println!("{} calls through {} probes", CALLS.load(Ordering::Relaxed), fastinst::probe_count());
//!     Ok(())
//! }
//! ```

pub mod api;
pub mod capi;
pub mod clock;
mod discovery;
pub mod error;
mod heap;
pub mod hooks;
pub mod log;
pub mod modules;
mod prefetch;
mod preload;
pub mod probe;
pub mod profile;
mod rawthread;
pub mod registry;
mod segmented;
pub mod sitetable;
pub mod sled;
mod spin;
pub mod stats;
mod tls;
mod toggle;
pub mod tools;
mod trace;

/// While the program runs, every allocation of this library's Rust code
/// comes from its own mappings, not from the program's `malloc` heap (see
/// [`heap`]).
#[global_allocator]
static HEAP: heap::Heap = heap::Heap;

pub use api::{
    activate, activate_function, deactivate, deactivate_function, handler, inactive_hits, is_active, on_discovery,
    probe_count, probe_meta, probes,
};
pub use discovery::MAX_CALLBACKS;
pub use error::{Error, Result};
pub use probe::{Handler, ProbeId, ProbeKind, ProbeMeta, Provider, Strategy};
pub use providers::finstrument::SiteForm;
pub use stats::{stats, Stats};
pub use toggle::{set_strategy, strategy};
