//! The SIGTRAP handler passes every trap that is not its own to the handler
//! the application installed before it. One test: signal dispositions are
//! process-wide.

use std::sync::atomic::{AtomicU32, Ordering};
use wordpatch::*;

static APP_TRAPS: AtomicU32 = AtomicU32::new(0);

extern "C" fn app_handler(_sig: libc::c_int, _info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    APP_TRAPS.fetch_add(1, Ordering::SeqCst);
}

#[test]
fn application_traps_reach_the_application() {
    // SAFETY: installing a plain SA_SIGINFO handler.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = app_handler as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO;
        assert_eq!(libc::sigaction(libc::SIGTRAP, &sa, std::ptr::null_mut()), 0);
    }
    install_trap_handler().unwrap();

    // raise(): SI_TKILL, not ours.
    // SAFETY: raising a signal with a handler installed.
    unsafe { libc::raise(libc::SIGTRAP) };
    assert_eq!(APP_TRAPS.load(Ordering::SeqCst), 1);

    // The application's own int3 in code that no patch ever touched.
    let mut mm = memmap2::MmapOptions::new().len(PAGE_SIZE).map_anon().unwrap();
    mm[..3].copy_from_slice(&[0xCC, 0x31, 0xC0]); // int3; xor eax,eax
    mm[3] = 0xC3;
    let m = mm.make_exec().unwrap();
    // SAFETY: `int3; xor eax, eax; ret` is a C-ABI function; the app handler
    // returns to the instruction after the int3.
    let f: extern "C" fn() -> u32 = unsafe { std::mem::transmute(m.as_ptr()) };
    assert_eq!(f(), 0);
    assert_eq!(APP_TRAPS.load(Ordering::SeqCst), 2);

    // A trap on a patch in flight is ours and never reaches the application.
    let mut mm = memmap2::MmapOptions::new().len(PAGE_SIZE).map_anon().unwrap();
    mm.fill(0xCC);
    mm[126..132].copy_from_slice(&[0xB8, 1, 0, 0, 0, 0xC3]);
    let m = mm.make_exec().unwrap();
    let site = m.as_ptr().wrapping_add(126) as *mut u8;
    // SAFETY: mov eax, imm32 -> mov eax, imm32.
    unsafe {
        start_patch(
            site,
            &[0xB8, 7, 0, 0, 0],
            &PatchOptions {
                expected: None,
                wait: Some(Wait::Tmax(10_000_000)),
            },
        )
    }
    .unwrap();
    // SAFETY: `mov eax, imm32; ret` is a C-ABI function.
    let g: extern "C" fn() -> u32 = unsafe { std::mem::transmute(site) };
    assert_eq!(g(), 7);
    assert_eq!(APP_TRAPS.load(Ordering::SeqCst), 2);
}
