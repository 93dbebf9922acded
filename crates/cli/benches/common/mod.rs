//! What the C benchmark harnesses share.

use std::path::PathBuf;

/// The directory cargo keeps `libfastinst.so` in beside this bench.
pub fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap().to_path_buf();
    assert!(
        deps.join("libfastinst.so").exists(),
        "libfastinst.so not built in {}",
        deps.display()
    );
    deps
}
