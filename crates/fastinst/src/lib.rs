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
//! - **Process** ([`process`]): starting from the `FASTINST_*` variables,
//!   the reports at exit, `fork` and `dlclose`. The preload library
//!   (`fastinst-preload`, `libfastinst.so`) is a thin `cdylib` around this
//!   crate: its constructor, allocator, interposed `dlopen`/`dlclose` and
//!   the C API of `fastinst.h`, whose data ([`c_abi`]) is defined here.
//!
//! # Example
//!
//! Count every call of every instrumented function: each entry probe is
//! switched on with a counting handler as it is discovered, and exit
//! probes are switched off; later the entry probes go off too, while the
//! program runs. Here the instrumented function is Rust code that calls
//! the hooks as `gcc -finstrument-functions` code does (hidden lines).
//!
//! ```
//! use fastinst::{ProbeId, ProbeKind};
//! use std::sync::atomic::{AtomicU64, Ordering};
//!
//! static CALLS: AtomicU64 = AtomicU64::new(0);
//!
//! extern "C" fn count(_: ProbeId) {
//!     CALLS.fetch_add(1, Ordering::Relaxed);
//! }
//! # /// `work` as `-finstrument-functions` makes it: the entry hook first,
//! # /// the exit hook last.
//! # #[inline(never)]
//! # extern "C" fn work() {
//! #     let f = std::hint::black_box(work as *const () as u64);
//! #     // SAFETY: the hooks take (this_fn, call_site) in the C ABI.
//! #     unsafe {
//! #         core::arch::asm!("call {h}", h = sym fastinst::hooks::__cyg_profile_func_enter,
//! #             in("rdi") f, in("rsi") 1u64, clobber_abi("C"));
//! #         core::arch::asm!("call {h}", h = sym fastinst::hooks::__cyg_profile_func_exit,
//! #             in("rdi") f, in("rsi") 1u64, clobber_abi("C"));
//! #     }
//! # }
//!
//! fn main() -> fastinst::Result<()> {
//!     fastinst::on_discovery(|m| {
//!         let _ = match m.kind {
//!             ProbeKind::Entry => fastinst::activate(m.id, count),
//!             ProbeKind::Exit | ProbeKind::Point => fastinst::deactivate(m.id),
//!         };
//!     })?;
//!     for _ in 0..1000 {
//!         work(); // instrumented code: the first call discovers its probes
//!     }
//!     assert_eq!(CALLS.load(Ordering::Relaxed), 1000);
//!     for m in fastinst::probes() {
//!         fastinst::deactivate(m.id)?; // its call site is patched off
//!     }
//!     work();
//!     assert_eq!(CALLS.load(Ordering::Relaxed), 1000);
//!     println!("{} calls through {} probes", CALLS.load(Ordering::Relaxed), fastinst::probe_count());
//!     Ok(())
//! }
//! ```

mod altstack;
mod api;
mod arch;
pub mod attach;
mod attached;
pub mod c_abi;
pub(crate) mod callcount;
pub mod clock;
mod code;
mod contention;
pub mod control;
mod discovery;
mod env;
mod error;
mod filter;
mod hookbind;
mod hookcost;
pub mod hooks;
pub mod log;
pub mod mapping;
mod modules;
mod prefetch;
mod probe;
pub mod process;
pub mod profile;
mod rawthread;
mod registry;
mod segmented;
mod sitetable;
mod sled;
pub mod spin;
mod stats;
mod timeline;
mod toggle;
mod tools;
mod trace;

pub use api::{
    activate, activate_function, deactivate, deactivate_function, handler, inactive_hits, is_active, on_discovery,
    probe_count, probe_meta, probes, stats,
};
pub use code::{set_strategy, strategy};
pub use discovery::MAX_CALLBACKS;
pub use error::{Error, Result};
pub use fastinst_macros::{instrument, probe};
pub use probe::{Handler, ProbeId, ProbeKind, ProbeMeta, Provider, Strategy};
pub use providers::finstrument::SiteForm;
pub use sled::{load as register_sleds, LoadReport};
pub use stats::Stats;
