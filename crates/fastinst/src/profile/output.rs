//! The profile's reports: at exit, after the last fold, and on demand
//! while the program runs.

use super::frames::close_open_frames;
use super::local::with_local;
use super::profiler::{get, Profiler};
use super::report;
use super::state::Folded;
use super::window::Kind;
use super::{cpusample, schedule};
use crate::registry;
use std::sync::atomic::Ordering;
use std::time::Instant;

/// The profiler stops: the running epoch ends now, so that the estimates
/// are complete (the report at exit). Every function counted whole folds
/// its count; windowed functions fold the epoch, or carry their
/// last rate to now.
pub(crate) fn final_fold(p: &'static Profiler) {
    let mut s = p.schedule.hold();
    let (ended, _) = crate::clock::period();
    let planned = s.planned;
    if planned {
        schedule::finish(p, &mut s);
    }
    let reading = s.exposure.advance(p);
    let (now, x_now) = (reading.at, reading.x());
    if planned {
        s.fold(p, x_now);
    }
    schedule::idle(&mut s, ended);
    let (t0, epoch_x) = (p.epoch_start.load(Ordering::Relaxed), s.epoch_x);
    let p_epoch = (x_now - epoch_x).max(0.0);
    for i in p.due.take(p.funcs.len()) {
        let Some(f) = p.funcs.get(i) else { continue };
        if f.window.kind() != Kind::Whole {
            continue;
        }
        // A count being handed to the stubs as the run ends loses what
        // they counted in those few instants.
        let Folded { n, overflow, .. } = p.fold_whole(f, i);
        // A count cut short in the last epoch (its probe went off past the
        // overflow, and no epoch's end made it windowed) is not exact: the
        // rest of the epoch is carried at its rate until then, as an epoch's
        // end would have.
        if overflow != 0 && p_epoch > 0.0 {
            // SAFETY: the schedule's lock is held.
            let e = unsafe { f.window.estimate_mut() };
            e.go_windowed_after_overflow(n as f64, overflow, p.exposed_from(t0), now, epoch_x, p_epoch);
            f.window.set_kind(Kind::Windowed);
        }
    }
}

/// Writes the timeline of the timed calls kept; `None` when it keeps none.
fn write_timeline(p: &Profiler, r: &report::Report) -> std::io::Result<Option<std::path::PathBuf>> {
    let tracks = p.timeline.tracks();
    if tracks.is_empty() {
        return Ok(None);
    }
    let names = (0..p.funcs.len()).map(|fi| report::fn_name(p, fi)).collect();
    let tl = fastinst_report::timeline::Timeline {
        tool: "fastinst profile".into(),
        pid: r.pid,
        names,
        tracks,
        origin: p.start.lock().0,
        ticks_per_us: r.tsc_mhz,
        dropped: p.timeline.dropped(),
        filtered: p.timeline.filtered(),
    };
    let path = p.out.join(format!("fastinst-profile.{}.timeline.json.gz", r.pid));
    fastinst_report::timeline::write_file(&tl, &path)?;
    Ok(Some(path))
}

/// The report as it stands, as one line of JSON (the `.json` file's
/// schema), for a live view (`fastinst top`); `None` before the profiler
/// started or any probe was found.
pub(crate) fn snapshot_json() -> Option<String> {
    let p = get()?;
    if registry::count() == 0 {
        return None;
    }
    serde_json::to_string(&report::collect(p)).ok()
}

/// Writes the reports (at exit, or on the signal) and prints where.
pub(crate) fn write_reports(on_demand: bool) {
    let Some(p) = get() else { return };
    if !on_demand {
        p.request_stop();
    }
    if registry::count() == 0 {
        return;
    }
    let skipped = p.rearm_skipped.load(Ordering::Relaxed);
    if skipped > 0 {
        crate::log::warn(format_args!(
            "profile: {skipped} re-activations skipped: those probes need a word patch, which the clone sampler does not make; FASTINST_PROFILE_SAMPLER=pthread samples them"
        ));
    }
    if !on_demand {
        let began = wordpatch::tsc::now();
        super::uncharged::freeze();
        cpusample::stop();
        // This thread's calls still in flight (main's, at exit) end now.
        with_local(|store, sh| close_open_frames(p, store, sh));
        // The profiler's own work at exit is not the program's: outside
        // any hook, it would count as exposure in the windows still open,
        // whose functions make no calls in it.
        crate::clock::charge(wordpatch::tsc::now().saturating_sub(began));
        final_fold(p);
    }
    let began = Instant::now();
    let r = report::collect(p);
    crate::log::debug(format_args!("profile: report collected in {:?}", began.elapsed()));
    let written = report::write_all(&r, &p.out).and_then(|mut w| {
        if let Some(path) = write_timeline(p, &r)? {
            w.files.push(path);
        }
        Ok(w)
    });
    crate::log::debug(format_args!(
        "profile: report collected and written in {:?}",
        began.elapsed()
    ));
    report::announce(
        &format!(
            "profile of {} functions ({} samples)",
            r.functions.len(),
            r.overhead.samples
        ),
        &p.out,
        written,
    );
    if !on_demand && !crate::attached::get() {
        // The process is exiting: handing the report's ~200,000 blocks
        // (a name per frame per path) back to malloc one by one took ~1.5
        // ms of SQLite's exit, for memory about to go anyway.
        std::mem::forget(r);
    }
}
