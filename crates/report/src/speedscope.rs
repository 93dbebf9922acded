//! The profile as speedscope opens it (<https://www.speedscope.app>, file
//! format `https://www.speedscope.app/file-format-schema.json`): one
//! "sampled" profile whose samples are the report's call paths, outermost
//! frame first, each weighted by its timed calls' own time in nanoseconds,
//! exactly the folded stacks and the flame graph's weights. speedscope then
//! gives the same flame graph, interactive, and its "left heavy" and
//! "sandwich" views.

use crate::{folded_weight, Report};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// The schema a speedscope file names.
pub const SCHEMA: &str = "https://www.speedscope.app/file-format-schema.json";

/// A speedscope file (the fields written here).
#[derive(Serialize, Deserialize, Debug, PartialEq)]
pub struct File {
    /// [`SCHEMA`].
    #[serde(rename = "$schema")]
    pub schema: String,
    /// The frames the samples index.
    pub shared: Shared,
    /// The profiles (one here).
    pub profiles: Vec<Sampled>,
    /// The file's name in the viewer.
    pub name: String,
    /// The profile shown first.
    #[serde(rename = "activeProfileIndex")]
    pub active_profile_index: usize,
    /// What wrote it.
    pub exporter: String,
}

/// Frames shared by the profiles.
#[derive(Serialize, Deserialize, Debug, PartialEq)]
pub struct Shared {
    /// Every frame, indexed by the samples.
    pub frames: Vec<Frame>,
}

/// One frame: a function.
#[derive(Serialize, Deserialize, Debug, PartialEq)]
pub struct Frame {
    /// Its name.
    pub name: String,
}

/// A "sampled" profile.
#[derive(Serialize, Deserialize, Debug, PartialEq)]
pub struct Sampled {
    /// Always "sampled".
    #[serde(rename = "type")]
    pub kind: String,
    /// Its name.
    pub name: String,
    /// The weights' unit.
    pub unit: String,
    /// 0.
    #[serde(rename = "startValue")]
    pub start_value: u64,
    /// The weights' sum.
    #[serde(rename = "endValue")]
    pub end_value: u64,
    /// Each sample's stack, outermost frame first, as frame indices.
    pub samples: Vec<Vec<usize>>,
    /// Each sample's weight.
    pub weights: Vec<u64>,
}

/// The report as a speedscope file.
pub fn to_file(r: &Report) -> File {
    let mut frames: Vec<Frame> = Vec::new();
    let mut index: HashMap<&str, usize> = HashMap::new();
    let (mut samples, mut weights) = (Vec::new(), Vec::new());
    for row in &r.stacks.paths {
        let w = folded_weight(row);
        if w == 0 {
            continue;
        }
        let stack = r
            .stacks
            .frames(row)
            .map(|name| {
                *index.entry(name).or_insert_with(|| {
                    frames.push(Frame { name: name.to_string() });
                    frames.len() - 1
                })
            })
            .collect();
        samples.push(stack);
        weights.push(w);
    }
    let name = format!("{} (pid {})", r.program, r.pid);
    File {
        schema: SCHEMA.into(),
        shared: Shared { frames },
        profiles: vec![Sampled {
            kind: "sampled".into(),
            name: format!("{name}: own time of timed calls"),
            unit: "nanoseconds".into(),
            start_value: 0,
            end_value: weights.iter().sum(),
            samples,
            weights,
        }],
        name,
        active_profile_index: 0,
        exporter: format!("fastinst {}", r.schema),
    }
}

/// The report as speedscope JSON.
pub fn render_speedscope(r: &Report) -> String {
    serde_json::to_string(&to_file(r)).expect("plain data serialises") + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Stacks;

    #[test]
    fn the_samples_are_the_folded_stacks_and_the_file_reads_back() {
        let mut r = Report {
            program: "demo".into(),
            pid: 3,
            schema: crate::SCHEMA.into(),
            ..Default::default()
        };
        r.stacks = Stacks::from_named([
            (vec!["main", "work"], 10, 7.0),
            (vec!["main", "work", "leaf"], 40, 2.5),
            (vec!["main", "idle"], 1, 0.0),
        ]);
        let text = render_speedscope(&r);
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        // What the schema requires of a file with a sampled profile.
        assert_eq!(v["$schema"], SCHEMA);
        let p = &v["profiles"][0];
        assert_eq!(p["type"], "sampled");
        for key in ["name", "unit", "startValue", "endValue", "samples", "weights"] {
            assert!(!p[key].is_null(), "profile field {key}");
        }
        let f: File = serde_json::from_str(&text).unwrap();
        let s = &f.profiles[0];
        assert_eq!(s.samples.len(), s.weights.len());
        let stacks: Vec<(Vec<&str>, u64)> = s
            .samples
            .iter()
            .zip(&s.weights)
            .map(|(st, &w)| (st.iter().map(|&i| f.shared.frames[i].name.as_str()).collect(), w))
            .collect();
        assert_eq!(
            stacks,
            [
                (vec!["main", "work"], 7_000_000),
                (vec!["main", "work", "leaf"], 2_500_000)
            ],
            "weighted as the folded stacks, zero-weight paths left out"
        );
        assert_eq!(s.end_value, 9_500_000);
        let folded: u64 = crate::render_folded(&r)
            .lines()
            .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
            .sum();
        assert_eq!(s.end_value, folded, "the same total as the folded stacks");
    }
}
