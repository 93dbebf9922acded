//! Probe macros for Rust code, on stable Rust: the sleds `rustc` cannot
//! emit itself (its `-Z instrument-mcount` and
//! `#[patchable_function_entry]` are nightly-only).
//!
//! - [`macro@instrument`] gives a function an entry sled and an exit probe:
//!   the function becomes a *sled function*, a naked function whose first
//!   instruction is a 5-byte NOP, followed by a jump to the body, and which
//!   is recorded in `__patchable_function_entries`, the table gcc and clang
//!   fill for `-fpatchable-function-entry=5`. To fastinst it is a sled like
//!   any C function's: registered at start-up with its entry and exit
//!   probes off, toggled to a `call`, its exit seen by return-address
//!   substitution, under `LD_PRELOAD=libfastinst.so`, `fastinst run`,
//!   `fastinst attach`, or the runtime linked into the program.
//! - [`macro@probe`] puts a 5-byte NOP at a point in a function and
//!   records it, with its name, in the `fastinst_points` section: a probe
//!   that fires each time the point is passed.
//!
//! Neither links anything: the expansion is inline assembly and a table
//! entry, so a program pays a NOP and a jump per call while the probes are
//! off, and nothing at all when no runtime is loaded.
//!
//! Re-exported by the `fastinst` crate as `fastinst::instrument` and
//! `fastinst::probe`; see there for the runtime's side.

mod instrument;
mod point;

use proc_macro::TokenStream;

/// Gives a function an entry sled and an exit probe (see the crate doc).
///
/// ```ignore
/// #[fastinst::instrument]
/// fn handle(request: &Request) -> Response { /* ... */ }
/// ```
///
/// Works on free functions, associated functions and methods of inherent
/// `impl` blocks (generic ones too: each instance is its own sled), and
/// `unsafe` functions. The function keeps its signature, visibility and
/// attributes; its body moves to a hidden `extern "C-unwind"` function that
/// the sled function jumps to, so a panic unwinds through it as before. In
/// reports it is named by its path (`crate::module::handle`,
/// `crate::Type::method`).
///
/// Refused at compile time, with the reason: `async` and `const`
/// functions, C-variadic ones, an explicit ABI, and `impl Trait` in return
/// position (the sled function must spell its return type). A method of a
/// *trait* impl cannot be instrumented (the impl may not hold the hidden
/// items): instrument a helper it calls.
#[proc_macro_attribute]
pub fn instrument(attr: TokenStream, item: TokenStream) -> TokenStream {
    instrument::expand(attr.into(), item.into())
        .unwrap_or_else(syn::Error::into_compile_error)
        .into()
}

/// A probe at this point of a function: a 5-byte NOP, recorded with the
/// name given (a string literal) in the `fastinst_points` section.
///
/// ```ignore
/// fastinst::probe!("cache-miss");
/// ```
///
/// While the probe is on, the NOP is a call into the runtime, which runs
/// the probe's handler (a point probe, kind `Point`, is never part of a
/// function's timing). The point is an ordinary call site to the compiler
/// (the `asm!` block declares the C ABI's caller-saved registers clobbered
/// and may use the stack), so the code around it keeps working whatever
/// the handler does; while it is off, that is its only cost beyond the NOP.
#[proc_macro]
pub fn probe(item: TokenStream) -> TokenStream {
    point::expand(item.into())
        .unwrap_or_else(syn::Error::into_compile_error)
        .into()
}
