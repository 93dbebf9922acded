//! What each wait costs per straddler patch, measured on the same fixture the
//! sweep uses: SyncCore (`membarrier`) against Tmax at the candidate T_max,
//! each on an idle site and while another thread executes it.
//!
//! Runs threads in this process: call it after the last forked trial.

use crate::recommend::WaitCosts;
use callpatch::Form;
use stress::bench;
use stress::Method;
use wordpatch::Wait;

/// The split costs are measured at (every split runs the same protocol).
const SPLIT: usize = 2;

/// Measures both waits with `reps` patches each (median ticks). SyncCore is
/// `None` where the kernel lacks `MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE`.
pub fn measure(tmax_ticks: u64, reps: usize) -> Result<WaitCosts, String> {
    let form = Form::CallRel32;
    let (synccore_idle, synccore_busy) = if wordpatch::ensure_sync_core().is_ok() {
        let s = Method::WordSync(Wait::SyncCore);
        (
            Some(bench::toggle_idle(s, form, SPLIT, reps)?.median),
            Some(bench::toggle_busy(s, form, SPLIT, reps)?.median),
        )
    } else {
        (None, None)
    };
    let t = Method::WordSync(Wait::Tmax(tmax_ticks));
    Ok(WaitCosts {
        synccore_idle,
        synccore_busy,
        tmax_idle: bench::toggle_idle(t, form, SPLIT, reps)?.median,
        tmax_busy: bench::toggle_busy(t, form, SPLIT, reps)?.median,
        tmax_ticks,
    })
}
