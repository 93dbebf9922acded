//! `calibrate`: the installation-time T_max benchmark (the paper's §8.1) and
//! the machine config it writes for wordpatch.
//!
//! The model: instruction fetch may keep a stale copy of a code line for at
//! most T_max ticks, so wordpatch's INT3 protocol for a patch that straddles
//! two lines is safe when each of its two waits exceeds T_max. Vendors publish
//! no such bound, so it is measured: a straddling `call` at every split
//! S = 1..4 ([`stress::Fixture`]), N executor threads running it, one patcher
//! toggling it with the INT3 protocol and a wait W, for each W of a sweep;
//! each trial in a forked child, so a crash is a counted failure
//! ([`sweep`]).
//!
//! A clean trial proves nothing if the executors were not running while the
//! patcher toggled (a loaded or small machine): each trial records how many of
//! its toggles overlapped executor progress, and only trials above
//! [`stress::MIN_CORUN_TOGGLES`] / [`stress::MIN_CORUN_RATIO`] count.
//!
//! From the table of failures per W and S (the paper's Fig. 9, [`table`],
//! [`svg`]) [`recommend()`] takes the smallest W from which every larger W
//! showed 0 failures with evidence, multiplies it by a safety margin, checks
//! the result in a verification run, and weighs its cost against the
//! `membarrier` SyncCore wait ([`cost`]) to pick the default wait strategy.
//! [`output`] writes it all, with the machine ([`machine`]) and the evidence,
//! to the config file wordpatch reads.
#![warn(missing_docs)]

pub mod cli;
pub mod cost;
pub mod machine;
pub mod output;
pub mod plan;
pub mod progress;
pub mod recommend;
pub mod svg;
pub mod sweep;
pub mod table;

pub use plan::Plan;
pub use recommend::{recommend, Recommendation, Thresholds};
pub use sweep::{Cell, Sweep};
