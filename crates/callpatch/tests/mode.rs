//! `FASTINST_CALL_MODE` sets callpatch's default mode (`paper` unless set;
//! an invalid value is reported and ignored). Each case runs the `mode`
//! example in a child process: the mode is resolved once per process.

use std::process::Command;

fn mode(value: Option<&str>) -> (String, String) {
    let exe = std::env::current_exe().unwrap();
    let p = exe.parent().unwrap().parent().unwrap().join("examples/mode");
    assert!(p.exists(), "{} not built (cargo test builds examples)", p.display());
    let mut c = Command::new(p);
    c.env_remove("FASTINST_CALL_MODE");
    if let Some(v) = value {
        c.env("FASTINST_CALL_MODE", v);
    }
    let o = c.output().unwrap();
    assert!(o.status.success());
    (
        String::from_utf8(o.stdout).unwrap(),
        String::from_utf8(o.stderr).unwrap(),
    )
}

#[test]
fn the_call_mode_setting_is_read_and_checked() {
    assert_eq!(mode(None).0, "mode Paper\n");
    assert_eq!(mode(Some("flip")).0, "mode Flip\n");
    assert_eq!(mode(Some("paper")).0, "mode Paper\n");
    let (out, err) = mode(Some("sideways"));
    assert_eq!(out, "mode Paper\n");
    assert!(err.contains("ignoring FASTINST_CALL_MODE"), "{err}");
}
