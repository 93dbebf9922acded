//! The paper's §8.5: the latent cost of an inactive probe, in each off form
//! and at every straddle split, against an empty loop and a loop over the
//! same code with a 5-byte NOP in the probe's place.
//!
//! Measured in this process on the stress crate's fixtures: a function
//! whose only instruction before `ret` is the probe site, placed so that
//! the site straddles a cache line at the split given (0: inside one
//! line), called in batches of 256.
//!
//! Off forms: callpatch flip (`mov eax, imm32`), callpatch paper (a 5-byte
//! NOP, except a call of a `ret` trampoline at the 1|4 split and a short
//! jump over the tail at 2|3, 3|2, 4|1), wordpatch (the 5-byte NOP), and the
//! sled provider's NOPs: gcc's sled as fastinst normalises it
//! (`66 66 66 66 90`), gcc's sled as compiled (five `90`s, never executed
//! by fastinst after normalisation: shown for comparison), clang's sled
//! (`0F 1F 44 00 08`).

use crate::error::{EvalError, Result};
use crate::measure::Summary;
use callpatch::Form;
use std::fmt::Write as _;

/// One measured form at one split.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Row {
    /// The off form.
    pub form: String,
    /// Bytes before the line boundary (0: no straddle).
    pub split: usize,
    /// Ticks per call.
    pub ticks: Summary,
}

/// The section's data.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Inactive {
    /// Ticks per iteration of an empty loop (`black_box(())`).
    pub empty_loop: Summary,
    /// Every form at every split.
    pub rows: Vec<Row>,
}

/// How each form is put in place.
enum How {
    Bytes([u8; 5]),
    State(&'static str),
}

const FORMS: [(&str, How); 7] = [
    ("5-byte NOP (wordpatch off)", How::Bytes(stress::NOP5)),
    ("callpatch flip off", How::State("flip")),
    ("callpatch paper off", How::State("paper")),
    (
        "gcc sled, normalised (66 66 66 66 90)",
        How::Bytes(providers::patchable::NORMALISED),
    ),
    ("gcc sled as compiled (90 x5)", How::Bytes([0x90; 5])),
    (
        "clang sled (0F 1F 44 00 08)",
        How::Bytes([0x0F, 0x1F, 0x44, 0x00, 0x08]),
    ),
    ("active: call of an empty stub", How::State("active")),
];

fn summary(s: stress::bench::Stats) -> Summary {
    Summary {
        median: s.median,
        p90: s.p90,
        n: s.n,
    }
}

/// Measures every form at splits 0..=4, `reps` batches each.
pub fn measure(reps: usize) -> Result<Inactive> {
    let empty_loop = summary(stress::bench::batched(256, reps, |_| std::hint::black_box(())));
    let mut rows = Vec::new();
    for (name, how) in &FORMS {
        for split in 0..5 {
            let r = match how {
                How::Bytes(b) => stress::bench::invoke_cost_bytes(Form::CallRel32, split, b, reps),
                How::State(s) => stress::bench::invoke_cost(Form::CallRel32, split, s, reps),
            }
            .map_err(|e| EvalError::Tool(format!("{name} at split {split}: {e}")))?;
            rows.push(Row {
                form: (*name).into(),
                split,
                ticks: summary(r),
            });
        }
    }
    Ok(Inactive { empty_loop, rows })
}

impl Inactive {
    fn nop(&self, split: usize) -> Option<f64> {
        self.rows
            .iter()
            .find(|r| r.split == split && r.form.starts_with("5-byte NOP"))
            .map(|r| r.ticks.median)
    }

    /// The table as Markdown: medians (p90) per split, and the difference
    /// from the NOP at the same split.
    pub fn markdown(&self) -> String {
        let mut s = format!(
            "Ticks per call of a function holding only the probe site (batches of 256; median, p90 in brackets; \
             in braces: minus the 5-byte NOP at the same split). An empty loop iteration: {:.2} ticks.\n\n",
            self.empty_loop.median
        );
        s.push_str(
            "| off form | no straddle | 1\\|4 | 2\\|3 | 3\\|2 | 4\\|1 |\n| --- | --- | --- | --- | --- | --- |\n",
        );
        for (name, _) in &FORMS {
            let _ = write!(s, "| {name} |");
            for split in 0..5 {
                match self.rows.iter().find(|r| r.form == *name && r.split == split) {
                    Some(r) => {
                        let d = self.nop(split).map_or(f64::NAN, |n| r.ticks.median - n);
                        let _ = write!(s, " {:.1} ({:.1}) {{{:+.1}}} |", r.ticks.median, r.ticks.p90, d);
                    }
                    None => s.push_str(" - |"),
                }
            }
            s.push('\n');
        }
        s
    }
}
