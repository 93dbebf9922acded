//! Timelines in the Chrome trace-event format, which Perfetto
//! (<https://ui.perfetto.dev>) and `chrome://tracing` open: one complete
//! slice (`"ph": "X"`) per traced call, on its thread's track, nested as
//! the calls were.
//!
//! A slice spans the call's wall-clock time, from its entry hook's stamp
//! to its exit hook's, so that the threads' tracks line up; the hooks'
//! time inside it (its own exit hook's start aside) is in that span.
//! `args.own_us` is the call's duration with every hook's time taken off,
//! the figure the report's percentiles and totals are made of; a profile's
//! slice is one of its timed calls, drawn at random, and `args.calls` says
//! how many calls it stands for. The file's `otherData` says how many calls
//! were not kept: a timeline is bounded (each tool keeps the first
//! `FASTINST_TIMELINE` calls to end).

use std::io::{self, Write};
use std::path::Path;

/// One call on a thread's track.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Slice {
    /// The function, an index into [`Timeline::names`].
    pub func: u32,
    /// Entry and exit stamps (TSC ticks).
    pub start: u64,
    /// See [`Slice::start`].
    pub end: u64,
    /// Its own duration, hooks' time taken off (TSC ticks).
    pub own: u64,
    /// The calls it stands for (1 for a traced call).
    pub weight: u32,
}

/// One thread's slices.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Track {
    /// Kernel thread id.
    pub tid: i32,
    /// Its calls, in any order.
    pub slices: Vec<Slice>,
}

/// A run's timeline.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Timeline {
    /// The tool that kept it (`fastinst trace`, `fastinst profile`).
    pub tool: String,
    /// Process id.
    pub pid: u32,
    /// Function names by index.
    pub names: Vec<String>,
    /// One track per thread.
    pub tracks: Vec<Track>,
    /// The TSC stamp that is time 0.
    pub origin: u64,
    /// TSC ticks per microsecond.
    pub ticks_per_us: f64,
    /// Calls that ended after the timeline was full.
    pub dropped: u64,
    /// Calls its filters left out: shorter than the minimum duration, or
    /// deeper than the depth limit.
    pub filtered: u64,
}

/// Writes `t` as Chrome trace-event JSON. Each track's slices are written
/// by start, an enclosing call before the calls inside it.
pub fn write_chrome<W: Write>(t: &Timeline, w: &mut W) -> io::Result<()> {
    let us = |ticks: u64| ticks as f64 / t.ticks_per_us.max(f64::MIN_POSITIVE);
    let name = |fi: u32| t.names.get(fi as usize).map_or("[unknown]", String::as_str);
    write!(
        w,
        "{{\"displayTimeUnit\":\"ns\",\"otherData\":{{\"tool\":{},\"dropped_calls\":{},\"filtered_calls\":{}}},\"traceEvents\":[",
        serde_json::to_string(&t.tool).map_err(io::Error::other)?,
        t.dropped,
        t.filtered
    )?;
    let mut first = true;
    let mut sep = |w: &mut W| -> io::Result<()> {
        if !std::mem::take(&mut first) {
            w.write_all(b",\n")?;
        }
        Ok(())
    };
    sep(w)?;
    write!(
        w,
        "{{\"ph\":\"M\",\"pid\":{},\"name\":\"process_name\",\"args\":{{\"name\":{}}}}}",
        t.pid,
        serde_json::to_string(&format!("{} {}", t.tool, t.pid)).map_err(io::Error::other)?
    )?;
    for track in &t.tracks {
        sep(w)?;
        write!(
            w,
            "{{\"ph\":\"M\",\"pid\":{},\"tid\":{},\"name\":\"thread_name\",\"args\":{{\"name\":\"thread {}\"}}}}",
            t.pid, track.tid, track.tid
        )?;
        let mut order: Vec<&Slice> = track.slices.iter().collect();
        // By start; at one start, the longer (enclosing) call first.
        order.sort_by(|a, b| a.start.cmp(&b.start).then(b.end.cmp(&a.end)));
        for s in order {
            sep(w)?;
            write!(
                w,
                "{{\"ph\":\"X\",\"pid\":{},\"tid\":{},\"name\":{},\"ts\":{:.3},\"dur\":{:.3},\"args\":{{\"own_us\":{:.3}",
                t.pid,
                track.tid,
                serde_json::to_string(name(s.func)).map_err(io::Error::other)?,
                us(s.start.saturating_sub(t.origin)),
                us(s.end.saturating_sub(s.start)),
                us(s.own)
            )?;
            if s.weight != 1 {
                write!(w, ",\"calls\":{}", s.weight)?;
            }
            w.write_all(b"}}")?;
        }
    }
    w.write_all(b"]}\n")
}

/// Writes `t` gzipped to `path` (`.json.gz`, which Perfetto and
/// `chrome://tracing` open as they are, a tenth of the size, and which a
/// `*.json` glob for the reports does not take) through a temporary file
/// beside it, so that an interrupted write never leaves a partial timeline
/// under the name.
pub fn write_file(t: &Timeline, path: &Path) -> io::Result<()> {
    let tmp = path.with_extension("tmp");
    let file = io::BufWriter::with_capacity(1 << 16, std::fs::File::create(&tmp)?);
    let mut w = flate2::write::GzEncoder::new(file, flate2::Compression::fast());
    let done = write_chrome(t, &mut w)
        .and_then(|()| w.finish())
        .and_then(|file| file.into_inner().map(drop).map_err(|e| e.into_error()));
    if let Err(e) = done {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The file parses as JSON, names its process and threads, and has
    /// one complete slice per call, by start, enclosing calls first, in
    /// microseconds from the origin, with each call's own time.
    #[test]
    fn a_timeline_is_chrome_trace_json_with_a_slice_per_call() {
        let t = Timeline {
            tool: "fastinst profile".into(),
            pid: 7,
            names: vec!["main".into(), "f \"quoted\"".into()],
            tracks: vec![Track {
                tid: 9,
                slices: vec![
                    Slice {
                        func: 1,
                        start: 1_500,
                        end: 2_000,
                        own: 400,
                        weight: 64,
                    },
                    Slice {
                        func: 0,
                        start: 1_000,
                        end: 5_000,
                        own: 3_000,
                        weight: 1,
                    },
                    Slice {
                        func: 1,
                        start: 1_000,
                        end: 1_200,
                        own: 150,
                        weight: 64,
                    },
                ],
            }],
            origin: 1_000,
            ticks_per_us: 1_000.0,
            dropped: 3,
            filtered: 5,
        };
        let mut out = Vec::new();
        write_chrome(&t, &mut out).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out).expect("valid JSON");
        assert_eq!(v["otherData"]["dropped_calls"], 3);
        assert_eq!(v["otherData"]["filtered_calls"], 5);
        assert_eq!(v["otherData"]["tool"], "fastinst profile");
        let ev = v["traceEvents"].as_array().unwrap();
        let meta: Vec<&str> = ev
            .iter()
            .filter(|e| e["ph"] == "M")
            .map(|e| e["name"].as_str().unwrap())
            .collect();
        assert_eq!(meta, ["process_name", "thread_name"]);
        let weights: Vec<Option<u64>> = ev
            .iter()
            .filter(|e| e["ph"] == "X")
            .map(|e| e["args"]["calls"].as_u64())
            .collect();
        assert_eq!(weights, [None, Some(64), Some(64)], "a traced call has no `calls`");
        let x: Vec<(String, f64, f64, f64)> = ev
            .iter()
            .filter(|e| e["ph"] == "X")
            .map(|e| {
                assert_eq!((e["pid"].as_u64(), e["tid"].as_i64()), (Some(7), Some(9)));
                (
                    e["name"].as_str().unwrap().to_string(),
                    e["ts"].as_f64().unwrap(),
                    e["dur"].as_f64().unwrap(),
                    e["args"]["own_us"].as_f64().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            x,
            [
                ("main".to_string(), 0.0, 4.0, 3.0),
                ("f \"quoted\"".to_string(), 0.0, 0.2, 0.15),
                ("f \"quoted\"".to_string(), 0.5, 0.5, 0.4),
            ]
        );
    }
}
