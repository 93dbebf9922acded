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
    resolved_with(env, &[])
}

/// [`resolved`] with the example's arguments `args`.
fn resolved_with(env: &[(&str, &str)], args: &[&str]) -> (String, String) {
    let mut c = Command::new(example());
    c.args(args);
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
        format!("wait Tmax({})\nsource Unproven\n", wordpatch::BUILTIN_TMAX)
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

/// Where the kernel lacks SyncCore (`FASTINST_SYNC_CORE=0` acts as if it
/// did) and nothing names a wait, no wait is proven: a straddler patch that
/// leaves its wait to the default is refused with a message that says what
/// to do, one inside a line is done, and a wait named in the environment
/// (the user's choice) is taken.
#[test]
fn without_sync_core_an_unproven_wait_is_refused_not_taken() {
    let off = ("FASTINST_SYNC_CORE", "0");
    let (out, _) = resolved_with(&[off], &["patch"]);
    assert!(
        out.starts_with(&format!("wait Tmax({})\nsource Unproven\n", wordpatch::BUILTIN_TMAX)),
        "{out}"
    );
    assert!(out.contains("patch straddler refused: "), "{out}");
    assert!(out.contains("run `fastinst calibrate`"), "{out}");
    assert!(out.contains("patch in-line done"), "{out}");
    let (out, _) = resolved_with(&[off, ("FASTINST_WAIT", "tmax:3000")], &["patch"]);
    assert!(out.starts_with("wait Tmax(3000)\nsource Env\n"), "{out}");
    assert!(
        out.contains("patch straddler done") && out.contains("patch in-line done"),
        "{out}"
    );
    // A machine config's wait is taken too.
    let dir = std::env::temp_dir().join(format!("wordpatch-unproven-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("machine.toml");
    std::fs::write(&cfg, "tmax_ticks = 4321\nwait = \"tmax\"\n").unwrap();
    let (out, _) = resolved_with(&[off, ("FASTINST_CONFIG", cfg.to_str().unwrap())], &["patch"]);
    assert!(
        out.contains("source Config(") && out.contains("patch straddler done"),
        "{out}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
    // Where the kernel has SyncCore, the default is proven.
    if wordpatch::ensure_sync_core().is_ok() {
        let (out, _) = resolved_with(&[], &["patch"]);
        assert!(out.contains("patch straddler done"), "{out}");
    }
}
