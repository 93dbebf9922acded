//! Cross-modification stress harness, live demo and benchmarks for
//! `wordpatch` and `callpatch`.
//!
//! The paper's §8.1 experiment as a library: [`Fixture`] generates a call
//! site at any cache-line split in its own pages, with code chosen so that
//! every torn mixture of two states crashes or returns an impossible value;
//! [`run_trial`] runs executor threads over the site (each [`Fetch`]ing it warm or cold) while one patcher
//! toggles it with a [`Method`], recording how many toggles overlapped
//! executor progress; [`run_forked`] runs a trial in a forked child so a
//! crash is a counted failure; [`run_config`] aggregates trials into
//! `N toggles, F failures`. [`run_sleds_forked`] stresses the other
//! rewrite: gcc's sleds made one instruction while threads run them, the
//! threads checked out of them, then armed. The `fastinst-stress` binary drives it all; the
//! integration tests and (later) `calibrate` call that binary.
#![warn(missing_docs)]

pub mod bench;
mod campaign;
mod crash;
mod fetch;
mod fixture;
mod method;
mod sleds;
pub mod ticks;
mod trial;

pub use campaign::{run_config, ConfigResult, MIN_CORUN_RATIO, MIN_CORUN_TOGGLES};
pub use crash::set_report_fd;
pub use fetch::Fetch;
pub use fixture::{Fixture, Place, NOP5, REL_A};
pub use method::{Method, Toggler};
pub use sleds::{run_sleds_forked, SledOutcome, SledSpec, SledStats};
pub use trial::{run_forked, run_trial, Outcome, TrialSpec, TrialStats};
