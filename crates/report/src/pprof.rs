//! The profile as pprof reads it: `profile.proto` (github.com/google/pprof,
//! `proto/profile.proto`), encoded by prost and gzipped, which `go tool
//! pprof` and the continuous-profiling backends that ingest pprof (Pyroscope,
//! Parca, Grafana) open.
//!
//! Five sample types, each saying what it holds:
//! - `self_time`/`nanoseconds` (the default), `calls`/`count` and
//!   `total_time`/`nanoseconds`: one single-frame sample per function with
//!   its self time (from CPU samples), its estimated calls and its
//!   inclusive time, exactly the text report's columns (`go tool pprof
//!   -top`, `-sample_index=calls`, `-sample_index=total_time`).
//! - `sampled_calls`/`count` and `sampled_time`/`nanoseconds`: one sample
//!   per call path of the report's stacks, leaf first, with the timed calls
//!   that ended there and their own time, as the flame graph draws them:
//!   the call graph (`-sample_index=sampled_time`, `-web`, `-tree`). Those
//!   are the timed calls only, not the program's whole time.
//!
//! The per-function samples carry 0 in the path types and the path samples
//! 0 in the per-function types, so no figure is counted twice.
//!
//! Every function has one location and one function record (no addresses
//! or lines: the report has names, not code addresses, for paths).

use crate::Report;
use prost::Message;
use std::collections::HashMap;
use std::io::Write;

/// `perftools.profiles.Profile`, the fields written here.
#[derive(Clone, PartialEq, Message)]
pub struct Profile {
    /// What each value of a sample is.
    #[prost(message, repeated, tag = "1")]
    pub sample_type: Vec<ValueType>,
    /// The samples.
    #[prost(message, repeated, tag = "2")]
    pub sample: Vec<Sample>,
    /// Locations (here one per function).
    #[prost(message, repeated, tag = "4")]
    pub location: Vec<Location>,
    /// Functions.
    #[prost(message, repeated, tag = "5")]
    pub function: Vec<Function>,
    /// Every string; index 0 is "".
    #[prost(string, repeated, tag = "6")]
    pub string_table: Vec<String>,
    /// When the profile was taken, ns since the epoch (0: unknown).
    #[prost(int64, tag = "9")]
    pub time_nanos: i64,
    /// How long the program ran, ns.
    #[prost(int64, tag = "10")]
    pub duration_nanos: i64,
    /// Free-form notes (string indices).
    #[prost(int64, repeated, tag = "13")]
    pub comment: Vec<i64>,
    /// The sample type viewers show first (a string index of a type).
    #[prost(int64, tag = "14")]
    pub default_sample_type: i64,
}

/// `ValueType`: a type and a unit, as string indices.
#[derive(Clone, PartialEq, Message)]
pub struct ValueType {
    /// E.g. "self_time".
    #[prost(int64, tag = "1")]
    pub r#type: i64,
    /// E.g. "nanoseconds".
    #[prost(int64, tag = "2")]
    pub unit: i64,
}

/// `Sample`: a call stack, leaf first, and its values.
#[derive(Clone, PartialEq, Message)]
pub struct Sample {
    /// Location ids, the leaf first.
    #[prost(uint64, repeated, tag = "1")]
    pub location_id: Vec<u64>,
    /// One value per sample type.
    #[prost(int64, repeated, tag = "2")]
    pub value: Vec<i64>,
}

/// `Location`: here a function, without an address.
#[derive(Clone, PartialEq, Message)]
pub struct Location {
    /// Its id (from 1).
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// The function(s) at this location.
    #[prost(message, repeated, tag = "4")]
    pub line: Vec<Line>,
}

/// `Line`: a function at a location.
#[derive(Clone, PartialEq, Message)]
pub struct Line {
    /// The function's id.
    #[prost(uint64, tag = "1")]
    pub function_id: u64,
}

/// `Function`.
#[derive(Clone, PartialEq, Message)]
pub struct Function {
    /// Its id (from 1).
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// Its name (a string index).
    #[prost(int64, tag = "2")]
    pub name: i64,
    /// Its system name (a string index; the same here).
    #[prost(int64, tag = "3")]
    pub system_name: i64,
}

/// The sample types, in the order of every sample's values.
pub const SAMPLE_TYPES: [(&str, &str); 5] = [
    ("self_time", "nanoseconds"),
    ("calls", "count"),
    ("total_time", "nanoseconds"),
    ("sampled_calls", "count"),
    ("sampled_time", "nanoseconds"),
];

struct Strings {
    table: Vec<String>,
    index: HashMap<String, i64>,
}

impl Strings {
    fn new() -> Strings {
        Strings {
            table: vec![String::new()],
            index: HashMap::from([(String::new(), 0)]),
        }
    }

    fn get(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        let i = self.table.len() as i64;
        self.table.push(s.to_string());
        self.index.insert(s.to_string(), i);
        i
    }
}

fn ns(ms: f64) -> i64 {
    (ms * 1e6).round() as i64
}

/// The report as a pprof `Profile`.
pub fn to_profile(r: &Report) -> Profile {
    let mut strings = Strings::new();
    let sample_type: Vec<ValueType> = SAMPLE_TYPES
        .iter()
        .map(|(t, u)| ValueType {
            r#type: strings.get(t),
            unit: strings.get(u),
        })
        .collect();
    let mut ids: HashMap<String, u64> = HashMap::new();
    let mut function = Vec::new();
    let mut location = Vec::new();
    let mut id_of = |name: &str, strings: &mut Strings| -> u64 {
        if let Some(&id) = ids.get(name) {
            return id;
        }
        let id = ids.len() as u64 + 1;
        let n = strings.get(name);
        function.push(Function {
            id,
            name: n,
            system_name: n,
        });
        location.push(Location {
            id,
            line: vec![Line { function_id: id }],
        });
        ids.insert(name.to_string(), id);
        id
    };
    let mut sample = Vec::new();
    for row in &r.stacks.paths {
        let mut stack: Vec<u64> = r.stacks.frames(row).map(|f| id_of(f, &mut strings)).collect();
        if stack.is_empty() {
            continue;
        }
        stack.reverse();
        sample.push(Sample {
            location_id: stack,
            value: vec![0, 0, 0, row.samples as i64, ns(row.self_ms)],
        });
    }
    for f in &r.functions {
        let id = id_of(&f.name, &mut strings);
        sample.push(Sample {
            location_id: vec![id],
            value: vec![ns(f.self_ms), f.calls_estimated.round() as i64, ns(f.total_ms), 0, 0],
        });
    }
    let comment = vec![
        strings.get(&format!("fastinst {} of {} (pid {})", r.schema, r.program, r.pid)),
        strings.get("self_time (CPU samples), calls (estimated: see the text report's +-) and total_time per function; sampled_calls and sampled_time (timed calls only) per call path"),
    ];
    let default_sample_type = sample_type[0].r#type;
    Profile {
        sample_type,
        sample,
        location,
        function,
        string_table: strings.table,
        time_nanos: 0,
        duration_nanos: ns(r.wall_ms),
        comment,
        default_sample_type,
    }
}

/// The report as a gzipped `profile.proto` (what `go tool pprof` reads).
pub fn render_pprof(r: &Report) -> Vec<u8> {
    let bytes = to_profile(r).encode_to_vec();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&bytes).expect("writing to memory");
    gz.finish().expect("writing to memory")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Stacks;
    use std::io::Read;

    fn report() -> Report {
        let mut r = Report {
            schema: crate::SCHEMA.into(),
            program: "demo".into(),
            pid: 7,
            wall_ms: 12.5,
            ..Default::default()
        };
        for (name, calls, total, own) in [
            ("main", 1.0, 12.0, 0.5),
            ("work", 1000.0, 9.0, 7.0),
            ("leaf", 5000.4, 2.0, 2.0),
        ] {
            r.functions.push(crate::tests::test_row(name, calls, total, own));
        }
        r.stacks = Stacks::from_named([(vec!["main", "work"], 10, 7.0), (vec!["main", "work", "leaf"], 40, 2.0)]);
        r
    }

    #[test]
    fn the_gzipped_profile_decodes_to_the_reports_paths_and_functions() {
        let bytes = render_pprof(&report());
        let mut raw = Vec::new();
        flate2::read::GzDecoder::new(&bytes[..]).read_to_end(&mut raw).unwrap();
        let p = Profile::decode(&raw[..]).unwrap();
        let s = |i: i64| p.string_table[i as usize].as_str();
        let types: Vec<(&str, &str)> = p.sample_type.iter().map(|t| (s(t.r#type), s(t.unit))).collect();
        assert_eq!(types, SAMPLE_TYPES);
        assert_eq!(s(p.default_sample_type), "self_time");
        assert_eq!(p.string_table[0], "");
        let name = |loc: u64| {
            let l = p.location.iter().find(|l| l.id == loc).unwrap();
            let f = p.function.iter().find(|f| f.id == l.line[0].function_id).unwrap();
            s(f.name).to_string()
        };
        let stacks: Vec<(Vec<String>, Vec<i64>)> = p
            .sample
            .iter()
            .map(|x| (x.location_id.iter().map(|&l| name(l)).collect(), x.value.clone()))
            .collect();
        assert!(stacks.contains(&(
            vec!["leaf".into(), "work".into(), "main".into()],
            vec![0, 0, 0, 40, 2_000_000]
        )));
        assert!(stacks.contains(&(vec!["work".into(), "main".into()], vec![0, 0, 0, 10, 7_000_000])));
        assert!(stacks.contains(&(vec!["leaf".into()], vec![2_000_000, 5000, 2_000_000, 0, 0])));
        assert!(stacks.contains(&(vec!["main".into()], vec![500_000, 1, 12_000_000, 0, 0])));
        assert_eq!(stacks.len(), 5, "two paths and three functions");
        assert_eq!(p.function.len(), 3, "one record per function");
        assert_eq!(p.duration_nanos, 12_500_000);
    }
}
