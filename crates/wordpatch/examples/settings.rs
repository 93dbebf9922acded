//! Prints the settings wordpatch resolves from the environment and the
//! machine config: the default straddler wait and its source, and the
//! T_max a bare `Tmax` wait takes. `tests/settings.rs` runs it under each
//! setting (a child process each: they are resolved once per process).

fn main() {
    let (wait, source) = wordpatch::default_wait();
    println!("wait {wait:?}");
    println!("source {source:?}");
    println!("tmax {}", wordpatch::default_tmax());
}
