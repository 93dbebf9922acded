//! The one profiler of the process: its [`State`] and its window
//! [`Schedule`], found by [`get`] from the handlers.

use super::schedule::Schedule;
use super::state::State;
use std::sync::OnceLock;

/// The profiler: the state every part shares, and the schedule of counting
/// windows, which reads that state and so is kept beside it.
pub(crate) struct Profiler {
    /// What the handlers, the schedule and the report share.
    pub state: State,
    /// The epoch's counting windows in time.
    pub schedule: Schedule,
}

impl std::ops::Deref for Profiler {
    type Target = State;
    fn deref(&self) -> &State {
        &self.state
    }
}

pub(super) static PROFILER: OnceLock<Profiler> = OnceLock::new();

pub(crate) fn get() -> Option<&'static Profiler> {
    PROFILER.get()
}
