//! A code page someone made read-only again after wordpatch made it
//! writable (as XRay's runtime and the `static-keys` crate do around their
//! own writes): the next patch there still succeeds, the fault handler
//! counting it; a write fault anywhere else still kills the process, with
//! SIGSEGV. A test binary of its own: the handler is process-wide.

use wordpatch::*;

fn code_page() -> memmap2::Mmap {
    let mut m = memmap2::MmapOptions::new().len(PAGE_SIZE).map_anon().unwrap();
    m.fill(0x90);
    m.make_exec().unwrap()
}

#[test]
fn a_page_protected_again_is_patched_and_other_faults_still_kill() {
    let page = code_page();
    let site = page.as_ptr().wrapping_add(128) as *mut u8;
    let before = reprotections_undone();
    // SAFETY: a 5-byte run of NOPs in our own executable page; no thread
    // runs it.
    unsafe { patch(site, &NOP5) }.unwrap();
    assert_eq!(&page[128..133], &NOP5);
    for round in 0..3u8 {
        // Another patcher's restore: read+execute again.
        // SAFETY: our own page; only its protection changes.
        let rc = unsafe {
            libc::mprotect(
                page.as_ptr() as *mut libc::c_void,
                PAGE_SIZE,
                libc::PROT_READ | libc::PROT_EXEC,
            )
        };
        assert_eq!(rc, 0);
        let new = [0x66, 0x66, 0x66, 0x66, 0x90];
        // SAFETY: as above.
        unsafe { patch(site, &new) }.unwrap_or_else(|e| panic!("round {round}: {e}"));
        assert_eq!(&page[128..133], &new);
        // SAFETY: as above.
        unsafe { patch(site, &NOP5) }.unwrap();
    }
    assert_eq!(reprotections_undone() - before, 3, "one fault resolved per restore");

    // A write to a read-only page wordpatch never made writable is the
    // program's own fault: it dies of it, in a child.
    let other = code_page();
    // SAFETY: fork in a test process; the child only writes and exits.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: a deliberate write to a read-only page.
        unsafe { std::ptr::write_volatile(other.as_ptr() as *mut u8, 0xCC) };
        // SAFETY: only reached if the write did not fault.
        unsafe { libc::_exit(0) };
    }
    let mut status = 0;
    // SAFETY: waits for the child just forked.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGSEGV,
        "status {status:#x}"
    );
    forget_pages(page.as_ptr(), PAGE_SIZE);
}
