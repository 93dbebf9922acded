//! `fastinst-calibrate`: measure T_max on this machine and write the machine
//! config. `fastinst-calibrate --help` for usage.

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    calibrate::cli::main(&args)
}
