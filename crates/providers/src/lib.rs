//! Knowledge of probe-site conventions, as pure logic.
//!
//! A *provider* knows how a compiler marks the places where probes can go,
//! and how to recognise, validate and rewrite them. This crate holds that
//! knowledge and nothing else: no globals, no live process. Every function
//! reads code through the [`Memory`] trait, so the same logic runs on the
//! live process (the `fastinst` runtime implements `Memory` over the loaded
//! modules) and on byte buffers in tests.
//!
//! - [`finstrument`]: the `-finstrument-functions` provider. Sites are the
//!   calls to `__cyg_profile_func_enter/exit` gcc and clang emit: `call rel32`
//!   direct or through a PLT stub, `call [rip+GOT]` (`-fno-plt`), and the tail
//!   `jmp` (rel32 or through the GOT) to the exit hook. A site is recognised
//!   only when the instruction decodes exactly and its target resolves to the
//!   hook; anything else is reported as [`finstrument::Unrecognised`].
//! - [`argload`]: the paper's optimised argument passing (§7): finds the
//!   instruction that loads `this_fn` into the first argument register and
//!   computes a same-length rewrite that loads a tagged probe id instead
//!   ([`tag`]), which can never be a code address.
//! - [`patchable`]: the `-fpatchable-function-entry` provider: entry NOP
//!   sleds listed in an ELF section, validated and normalised to one
//!   instruction that can be toggled to a `call`.
//! - [`mcount`]: the `-pg` provider: `call mcount`, `call __fentry__`
//!   (`-mfentry`) and the NOPs of `-mnop-mcount`, found through
//!   `__mcount_loc` or the prologues and turned into sleds.
//! - [`xray`]: clang's `-fxray-instrument` entry sleds, listed in
//!   `xray_instr_map`, made 5-byte sites.
//! - [`points`]: the point probes of Rust code (`fastinst::probe!`),
//!   recorded with their names.
//! - [`elf`]: function symbols of an ELF image (goblin), demangled.
//! - [`hookslots`]: the GOT slots a module calls the
//!   `-finstrument-functions` hooks through.
//! - [`sections`]: the lean section-header view start-up reads modules
//!   through (headers once, names one at a time).
//! - [`offline`]: the same recognisers over an ELF file on disk (`fastinst
//!   sites`).
//! - [`decode`]: the instruction stream the others share (iced-x86), which
//!   steps over instructions the runtime has patched.

pub mod argload;
pub mod decode;
pub mod elf;
mod fileimage;
pub mod finstrument;
pub mod hookslots;
pub mod mcount;
pub mod memory;
pub mod offline;
pub mod patchable;
pub mod points;
pub mod sections;
pub mod tag;
pub mod xray;

pub use memory::{Image, Memory};
