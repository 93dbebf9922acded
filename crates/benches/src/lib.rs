//! The paper's evaluation reproduced on the machine at hand.
//!
//! Now: Table 3, the latency profiler on real open-source programs
//! (`fastinst-table3`). The programs' C sources come from crates.io
//! ([`sources`]), are built with gcc and clang, plain and instrumented
//! ([`programs`]), and run one at a time under every configuration
//! ([`table3`]); CPU time comes from `getrusage` ([`measure`]).

pub mod error;
pub mod measure;
pub mod programs;
pub mod sources;
pub mod table3;

pub use error::{EvalError, Result};
