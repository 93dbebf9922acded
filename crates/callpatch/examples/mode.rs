//! Prints callpatch's process-wide default toggle mode, as resolved from
//! `FASTINST_CALL_MODE`; `tests/mode.rs` runs it under each value (a child
//! process each: the mode is resolved once per process).

fn main() {
    println!("mode {:?}", callpatch::default_mode());
}
