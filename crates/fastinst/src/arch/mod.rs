//! Every line of x86-64 assembly the runtime has, in one place.
//!
//! The runtime patches x86-64 machine code and runs hooks that must cost a
//! few nanoseconds, so some of it cannot be Rust: hooks and trampolines
//! that save exactly the registers the ABI leaves a caller, thread-local
//! slots read with one `fs:`-relative move, a thread started with a bare
//! `clone`. Each is here, beside the reasons for its every instruction:
//!
//! - [`stubs`]: the TSC stamp every clocked hook path uses, the
//!   `-finstrument-functions` hook stubs, the unwinder's forwarding stubs,
//!   and the calls the hook-cost calibration times;
//! - [`trampolines`]: the sled trampolines (entry and exit, per vector
//!   width);
//! - [`tls`]: the static thread-local slots;
//! - [`cpu`]: the thread pointer, raw system calls and the raw `clone`.
//!
//! Code that needs a symbol of the runtime's (a handler, a flag) passes it
//! to the macros here as an argument, so this module depends on nothing
//! above it. Another architecture would need its own version of each, and
//! of the code patching in `wordpatch` and `callpatch`: until then the
//! crate refuses to build there.

#[cfg(not(target_arch = "x86_64"))]
compile_error!("fastinst patches x86-64 machine code: it builds for x86_64 only");

pub(crate) mod cpu;
pub(crate) mod stubs;
pub(crate) mod tls;
pub(crate) mod trampolines;
