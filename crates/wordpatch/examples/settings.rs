//! Prints the settings wordpatch resolves from the environment and the
//! machine config: the default straddler wait and its source, and the
//! T_max a bare `Tmax` wait takes. `tests/settings.rs` runs it under each
//! setting (a child process each: they are resolved once per process).
//!
//! With the argument `patch`, it then patches two `mov eax, imm32`
//! instructions that leave their wait to the default, one straddling a
//! cache line and one inside a line, and prints whether each was done or
//! refused (no other thread runs them, so any wait would do).

fn main() {
    let (wait, source) = wordpatch::default_wait();
    println!("wait {wait:?}");
    println!("source {source:?}");
    println!("tmax {}", wordpatch::default_tmax());
    if std::env::args().nth(1).as_deref() == Some("patch") {
        patch_two_sites();
    }
}

fn patch_two_sites() {
    const MOV: [u8; 5] = [0xB8, 1, 0, 0, 0];
    // SAFETY: a fresh private anonymous mapping, no address hint.
    let page = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(page, libc::MAP_FAILED, "mmap: {}", std::io::Error::last_os_error());
    let base = page as usize;
    for (name, at) in [("straddler", base + 64 - 3), ("in-line", base + 128)] {
        // SAFETY: inside the page just mapped, which nothing else uses.
        unsafe { std::ptr::copy_nonoverlapping(MOV.as_ptr(), at as *mut u8, MOV.len()) };
        // SAFETY: a whole instruction of the same length, which no thread
        // executes.
        let r = unsafe { wordpatch::patch(at as *mut u8, &[0xB8, 2, 0, 0, 0]) };
        match r {
            Ok(()) => println!("patch {name} done"),
            Err(e) => println!("patch {name} refused: {e}"),
        }
    }
}
