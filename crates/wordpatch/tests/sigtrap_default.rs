//! With no application handler, a SIGTRAP that is not ours still kills the
//! process with SIGTRAP, as it would without wordpatch.

#[test]
fn foreign_trap_still_takes_the_default_action() {
    wordpatch::install_trap_handler().unwrap();
    // SAFETY: the child only raises a signal and exits (async-signal-safe).
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        // SAFETY: child: raise, then leave without running any Rust teardown.
        unsafe {
            libc::raise(libc::SIGTRAP);
            libc::_exit(0);
        }
    }
    let mut status = 0;
    // SAFETY: reaping our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(
        libc::WIFSIGNALED(status),
        "child survived a foreign SIGTRAP: status {status:#x}"
    );
    assert_eq!(libc::WTERMSIG(status), libc::SIGTRAP);
}
