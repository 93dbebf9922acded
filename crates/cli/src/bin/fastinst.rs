//! The `fastinst` command; see the `fastinst_cli` crate.

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    fastinst_cli::main(&args)
}
