//! `FASTINST_WAIT`, `FASTINST_TMAX` and `FASTINST_CONFIG` change what
//! wordpatch resolves, in the documented order (env, then the machine
//! config, then SyncCore or the built-in T_max), and an invalid value is
//! reported and ignored. Each case runs the `settings` example in a child
//! process: the settings are resolved once per process.

use std::path::PathBuf;
use std::process::Command;

fn example() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let p = exe.parent().unwrap().parent().unwrap().join("examples/settings");
    assert!(p.exists(), "{} not built (cargo test builds examples)", p.display());
    p
}

/// (stdout, stderr) of the example under `env`, with no other
/// `FASTINST_*` variable and, unless given, no machine config.
fn resolved(env: &[(&str, &str)]) -> (String, String) {
    let mut c = Command::new(example());
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("FASTINST_")) {
        c.env_remove(k);
    }
    c.env("FASTINST_CONFIG", "/nonexistent/fastinst-machine.toml");
    c.envs(env.iter().copied());
    let o = c.output().unwrap();
    assert!(o.status.success());
    (
        String::from_utf8(o.stdout).unwrap(),
        String::from_utf8(o.stderr).unwrap(),
    )
}

#[test]
fn each_setting_changes_the_resolved_wait() {
    let builtin = if wordpatch::ensure_sync_core().is_ok() {
        "wait SyncCore\nsource BuiltIn\n".to_string()
    } else {
        format!("wait Tmax({})\nsource BuiltIn\n", wordpatch::BUILTIN_TMAX)
    };
    let (out, _) = resolved(&[]);
    assert!(out.starts_with(&builtin), "{out}");
    assert!(out.contains(&format!("tmax {}", wordpatch::BUILTIN_TMAX)), "{out}");

    let (out, _) = resolved(&[("FASTINST_WAIT", "tmax:1234")]);
    assert!(out.starts_with("wait Tmax(1234)\nsource Env\n"), "{out}");
    let (out, _) = resolved(&[("FASTINST_WAIT", "synccore")]);
    assert!(out.starts_with("wait SyncCore\nsource Env\n"), "{out}");
    // FASTINST_TMAX alone asks for a Tmax wait of that many ticks, and is
    // the T_max of a bare Tmax wait.
    let (out, _) = resolved(&[("FASTINST_TMAX", "777")]);
    assert!(out.starts_with("wait Tmax(777)\nsource Env\n"), "{out}");
    assert!(out.contains("tmax 777"), "{out}");
    // An explicit SyncCore wins over a T_max.
    let (out, _) = resolved(&[("FASTINST_WAIT", "synccore"), ("FASTINST_TMAX", "777")]);
    assert!(out.starts_with("wait SyncCore\nsource Env\n"), "{out}");

    // Invalid values are reported and ignored.
    let (out, err) = resolved(&[("FASTINST_WAIT", "sometimes")]);
    assert!(out.starts_with(&builtin), "{out}");
    assert!(err.contains("ignoring FASTINST_WAIT"), "{err}");
    let (out, err) = resolved(&[("FASTINST_TMAX", "lots")]);
    assert!(out.starts_with(&builtin), "{out}");
    assert!(err.contains("ignoring FASTINST_TMAX"), "{err}");

    // A machine config recommends a wait and gives the T_max; env wins.
    let dir = std::env::temp_dir().join(format!("wordpatch-settings-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("machine.toml");
    std::fs::write(&cfg, "tmax_ticks = 4321\nwait = \"tmax\"\n").unwrap();
    let cfg_s = cfg.to_str().unwrap();
    let (out, err) = resolved(&[("FASTINST_CONFIG", cfg_s)]);
    assert!(out.starts_with("wait Tmax(4321)\nsource Config("), "{out}\n{err}");
    assert!(out.contains("tmax 4321"), "{out}");
    let (out, _) = resolved(&[("FASTINST_CONFIG", cfg_s), ("FASTINST_WAIT", "synccore")]);
    assert!(out.starts_with("wait SyncCore\nsource Env\n"), "{out}");
    std::fs::remove_dir_all(&dir).unwrap();
}
