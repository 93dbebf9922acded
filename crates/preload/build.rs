//! Puts `fastinst.h` beside `libfastinst.so` (`target/<profile>/`), so the
//! header and the library it declares travel together.

use std::path::Path;

fn main() {
    println!("cargo:rerun-if-changed=include/fastinst.h");
    let Ok(out) = std::env::var("OUT_DIR") else { return };
    // OUT_DIR is <target>/<profile>/build/<package>-<hash>/out.
    if let Some(profile_dir) = Path::new(&out).ancestors().nth(3) {
        if let Err(e) = std::fs::copy("include/fastinst.h", profile_dir.join("fastinst.h")) {
            println!("cargo:warning=could not copy fastinst.h beside the library: {e}");
        }
    }
}
