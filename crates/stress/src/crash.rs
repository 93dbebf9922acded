//! A crash reporter for forked trials: on SIGSEGV, SIGILL, SIGBUS or an
//! unhandled SIGTRAP it writes the signal, RIP, fault address and the bytes at
//! the site to stderr, then dies of the same signal. It tells a torn
//! instruction (and which mixture of bytes ran) from any other crash.
//! Async-signal-safe: a fixed buffer (`wordpatch::Line`), `write(2)`, no
//! allocation.

use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};

static SITE: AtomicUsize = AtomicUsize::new(0);
/// Where reports go: stderr unless [`set_report_fd`] chose a log.
static REPORT_FD: AtomicI32 = AtomicI32::new(2);

/// Sends crash reports of later trials to `fd` (an open, writable file the
/// caller keeps open) instead of stderr: a tool whose output is a table keeps
/// the table readable and the reports in a log.
pub fn set_report_fd(fd: i32) {
    REPORT_FD.store(fd, Ordering::Relaxed);
}

extern "C" fn report(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let mut l = wordpatch::Line::default();
    // SAFETY: the kernel passes valid siginfo/ucontext to an SA_SIGINFO
    // handler; the site bytes are mapped (the fixture outlives the trial).
    unsafe {
        let rip = (*(ctx as *mut libc::ucontext_t)).uc_mcontext.gregs[libc::REG_RIP as usize] as u64;
        let addr = (*info).si_addr() as u64;
        let site = SITE.load(Ordering::Relaxed);
        l.push(b"trial crash: signal ");
        l.hex_digits(sig as u64, 2);
        l.push(b" rip ");
        l.hex_digits(rip, 12);
        l.push(b" addr ");
        l.hex_digits(addr, 12);
        l.push(b" site ");
        l.hex_digits(site as u64, 12);
        if site != 0 {
            l.push(b" (rip-site-5 ");
            l.hex_digits(rip.wrapping_sub(site as u64 + 5), 16);
            l.push(b") bytes now");
            for i in 0..6 {
                l.push(b" ");
                l.hex_digits(*((site + i) as *const u8) as u64, 2);
            }
        }
        if let Some(d) = wordpatch::diagnose(site as *const u8) {
            let now = wordpatch::tsc::now();
            l.push(b"; in flight: state ");
            l.hex_digits(d.state as u64, 1);
            l.push(b" wait ");
            l.hex_digits(d.wait, 8);
            l.push(b" now-lock ");
            l.hex_digits(now.wrapping_sub(d.t_lock), 8);
            l.push(b" back-lock ");
            l.hex_digits(d.t_back.wrapping_sub(d.t_lock), 8);
            l.push(if d.back_by_trap {
                b" back by trap"
            } else {
                b" back by patcher"
            });
        }
        l.push(b"\n");
        l.write_to(REPORT_FD.load(Ordering::Relaxed));
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = libc::SIG_DFL;
        libc::sigaction(sig, &sa, std::ptr::null_mut());
        libc::raise(sig);
    }
}

/// Installs the reporter for the crash signals, before wordpatch installs
/// its SIGTRAP handler, so that wordpatch chains foreign traps to it.
pub(crate) fn install() {
    for sig in [libc::SIGSEGV, libc::SIGILL, libc::SIGBUS, libc::SIGTRAP] {
        // SAFETY: installing a handler in the forked trial child.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = report as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO;
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// Names the site whose bytes a crash report shows.
pub(crate) fn set_site(site: usize) {
    SITE.store(site, Ordering::Relaxed);
}
