//! A crash reporter for forked trials: on SIGSEGV, SIGILL, SIGBUS or an
//! unhandled SIGTRAP it writes the signal, RIP, fault address and the bytes at
//! the site to stderr, then dies of the same signal. It tells a torn
//! instruction (and which mixture of bytes ran) from any other crash.
//! Async-signal-safe: fixed buffers, `write(2)`, no allocation.

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

fn hex(buf: &mut [u8], at: &mut usize, v: u64, digits: usize) {
    for i in (0..digits).rev() {
        let d = ((v >> (4 * i)) & 0xF) as u8;
        if *at < buf.len() {
            buf[*at] = if d < 10 { b'0' + d } else { b'a' + d - 10 };
            *at += 1;
        }
    }
}

fn text(buf: &mut [u8], at: &mut usize, s: &[u8]) {
    for &c in s {
        if *at < buf.len() {
            buf[*at] = c;
            *at += 1;
        }
    }
}

extern "C" fn report(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let mut buf = [0u8; 512];
    let mut at = 0;
    // SAFETY: the kernel passes valid siginfo/ucontext to an SA_SIGINFO
    // handler; the site bytes are mapped (the fixture outlives the trial).
    unsafe {
        let rip = (*(ctx as *mut libc::ucontext_t)).uc_mcontext.gregs[libc::REG_RIP as usize] as u64;
        let addr = (*info).si_addr() as u64;
        let site = SITE.load(Ordering::Relaxed);
        text(&mut buf, &mut at, b"trial crash: signal ");
        hex(&mut buf, &mut at, sig as u64, 2);
        text(&mut buf, &mut at, b" rip ");
        hex(&mut buf, &mut at, rip, 12);
        text(&mut buf, &mut at, b" addr ");
        hex(&mut buf, &mut at, addr, 12);
        text(&mut buf, &mut at, b" site ");
        hex(&mut buf, &mut at, site as u64, 12);
        if site != 0 {
            text(&mut buf, &mut at, b" (rip-site-5 ");
            hex(&mut buf, &mut at, rip.wrapping_sub(site as u64 + 5), 16);
            text(&mut buf, &mut at, b") bytes now");
            for i in 0..6 {
                text(&mut buf, &mut at, b" ");
                hex(&mut buf, &mut at, *((site + i) as *const u8) as u64, 2);
            }
        }
        if let Some(d) = wordpatch::diagnose(site as *const u8) {
            let now = wordpatch::tsc::now();
            text(&mut buf, &mut at, b"; in flight: state ");
            hex(&mut buf, &mut at, d.state as u64, 1);
            text(&mut buf, &mut at, b" wait ");
            hex(&mut buf, &mut at, d.wait, 8);
            text(&mut buf, &mut at, b" now-lock ");
            hex(&mut buf, &mut at, now.wrapping_sub(d.t_lock), 8);
            text(&mut buf, &mut at, b" back-lock ");
            hex(&mut buf, &mut at, d.t_back.wrapping_sub(d.t_lock), 8);
            text(
                &mut buf,
                &mut at,
                if d.back_by_trap {
                    b" back by trap"
                } else {
                    b" back by patcher"
                },
            );
        }
        text(&mut buf, &mut at, b"\n");
        libc::write(
            REPORT_FD.load(Ordering::Relaxed),
            buf.as_ptr() as *const libc::c_void,
            at,
        );
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
