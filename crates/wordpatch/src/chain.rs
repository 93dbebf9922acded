//! Handing a signal that is not ours to the disposition found before ours,
//! for this crate's handlers (SIGTRAP for the INT3 lock, SIGSEGV for pages
//! made read-only again, SIGILL's report), and the line a fatal fault
//! writes before the default action kills the process.

/// A disposition found before one of ours. Written only while our handler
/// is not installed (or being re-installed over a foreign one), read only
/// by the handler.
pub(crate) struct Prev(std::cell::UnsafeCell<libc::sigaction>);

// SAFETY: written before the handler that reads it is installed (sigaction
// is a full barrier for the signal's delivery), and never written while
// ours is the installed handler.
unsafe impl Sync for Prev {}

impl Prev {
    /// SIG_DFL with an empty mask.
    pub(crate) const fn new() -> Prev {
        // SAFETY: an all-zero sigaction is SIG_DFL with an empty mask.
        Prev(std::cell::UnsafeCell::new(unsafe { std::mem::zeroed() }))
    }

    /// Where the previous disposition is stored.
    pub(crate) fn get(&self) -> *mut libc::sigaction {
        self.0.get()
    }
}

/// An `SA_SIGINFO` handler.
pub(crate) type Handler = extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void);

/// Installs `handler` for `sig` (with its `siginfo`, restarting system
/// calls, on the thread's alternate stack where it has one: a stack
/// overflow's fault must still reach the handler it chains to), keeping
/// the disposition it replaces in `prev`. The OS error of a refusal.
///
/// # Safety
/// `handler` is not `sig`'s disposition now (or its install is serialised
/// by the caller and it does not read `prev` meanwhile): `prev` is written
/// while no handler of ours reads it.
pub(crate) unsafe fn install(sig: libc::c_int, handler: Handler, prev: &Prev) -> Result<(), i32> {
    let errno = || std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
    // SAFETY: plain sigaction calls with valid pointers; `prev` is written
    // before ours is installed (the contract).
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(sig, std::ptr::null(), &mut old) != 0 {
            return Err(errno());
        }
        *prev.get() = old;
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = handler as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART | libc::SA_ONSTACK;
        libc::sigemptyset(&mut sa.sa_mask);
        if libc::sigaction(sig, &sa, std::ptr::null_mut()) != 0 {
            return Err(errno());
        }
    }
    Ok(())
}

/// Whether `handler` is `sig`'s disposition now.
pub(crate) fn is_current(sig: libc::c_int, handler: Handler) -> bool {
    // SAFETY: query only.
    unsafe {
        let mut cur: libc::sigaction = std::mem::zeroed();
        libc::sigaction(sig, std::ptr::null(), &mut cur) == 0 && cur.sa_sigaction == handler as *const () as usize
    }
}

/// Hands signal `sig` to `prev`: calls its handler, ignores it, or for the
/// default action restores it and raises the signal again, which takes
/// effect when the handler returns. A fault (`fault`) is never ignored (its
/// instruction would only fault again) and never left to run again: a
/// fault at code being patched might not recur once the patch is done,
/// and a crash must not go unseen.
///
/// # Safety
/// Called from a signal handler with the kernel's arguments; `prev` is not
/// written while that handler is installed.
pub(crate) unsafe fn chain(
    prev: &Prev,
    sig: libc::c_int,
    info: *mut libc::siginfo_t,
    ctx: *mut libc::c_void,
    fault: bool,
) {
    // SAFETY: not written while our handler is installed (the contract).
    let prev = unsafe { &*prev.get() };
    match prev.sa_sigaction {
        libc::SIG_IGN if !fault => {}
        libc::SIG_DFL | libc::SIG_IGN => {
            if fault {
                // SAFETY: the kernel's arguments to an SA_SIGINFO handler.
                unsafe { report_fatal(sig, info, ctx) };
            }
            // SAFETY: restoring the default disposition and re-raising are
            // async-signal-safe; the raised signal is blocked until we
            // return, then takes the default action.
            unsafe {
                let mut sa: libc::sigaction = std::mem::zeroed();
                sa.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(sig, &sa, std::ptr::null_mut());
                libc::raise(sig);
            }
        }
        h if prev.sa_flags & libc::SA_SIGINFO != 0 => {
            // SAFETY: the previous disposition declared an SA_SIGINFO handler
            // at this address.
            let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                unsafe { std::mem::transmute(h) };
            f(sig, info, ctx);
        }
        h => {
            // SAFETY: the previous disposition declared a plain handler here.
            let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(h) };
            f(sig);
        }
    }
}

/// Writes one line to stderr for a fault about to kill the process: the
/// signal, the faulting address, the instruction pointer and the code
/// there (for an illegal instruction, from a few bytes before it). A
/// signal raised again from a handler is not logged by the kernel as a
/// fault is, and a crash in code being patched is worth its bytes. No
/// allocation: the line is built in a buffer on the stack and written with
/// one `write`.
///
/// # Safety
/// `info` and `ctx` are the kernel's arguments to an `SA_SIGINFO` handler.
unsafe fn report_fatal(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let mut line = crate::Line::default();
    line.push(b"fastinst: fatal signal ");
    line.dec(sig.unsigned_abs().into());
    let addr = if info.is_null() {
        0
    } else {
        // SAFETY: a fault's siginfo carries its address.
        unsafe { (*info).si_addr() as u64 }
    };
    line.push(b" at address ");
    line.hex(addr);
    let ip = if ctx.is_null() {
        0
    } else {
        // SAFETY: an SA_SIGINFO handler's third argument is its ucontext.
        unsafe { (*(ctx as *const libc::ucontext_t)).uc_mcontext.gregs[libc::REG_RIP as usize] as u64 }
    };
    line.push(b", ip ");
    line.hex(ip);
    if let Some((from, to)) = readable_code(sig, addr, ip) {
        line.push(b", code");
        if from < ip {
            line.push(b" from ip-");
            line.dec(ip - from);
        }
        line.push(b":");
        for a in from..to {
            line.push(b" ");
            // SAFETY: `readable_code` keeps to bytes that were fetched or
            // share a page with them.
            line.hex_digits(u64::from(unsafe { std::ptr::read_volatile(a as *const u8) }), 2);
        }
    }
    line.push(b"\n");
    line.write_to(2);
}

/// The range of code bytes around `ip` that may be read for a report of
/// signal `sig` at `addr`: none where the fault was in fetching them.
/// After an illegal instruction, the page of `ip` is mapped and was
/// fetched from, so up to 8 bytes before and 16 from `ip` inside that
/// page; after another fault elsewhere, the instruction at `ip` was
/// decoded, so 16 bytes (an instruction may cross into the next page only
/// where one does).
fn readable_code(sig: libc::c_int, addr: u64, ip: u64) -> Option<(u64, u64)> {
    if ip == 0 {
        return None;
    }
    if sig == libc::SIGILL {
        let page = ip & !(crate::PAGE_SIZE as u64 - 1);
        let end = page + crate::PAGE_SIZE as u64;
        return Some((ip.saturating_sub(8).max(page), (ip + 16).min(end)));
    }
    (addr < ip || addr >= ip + 16).then_some((ip, ip + 16))
}

#[cfg(test)]
mod tests {
    use super::readable_code;

    #[test]
    fn an_illegal_instructions_bytes_stay_inside_its_page() {
        assert_eq!(readable_code(libc::SIGILL, 0x5010, 0x5010), Some((0x5008, 0x5020)));
        assert_eq!(readable_code(libc::SIGILL, 0x5003, 0x5003), Some((0x5000, 0x5013)));
        assert_eq!(readable_code(libc::SIGILL, 0x5ffa, 0x5ffa), Some((0x5ff2, 0x6000)));
        assert_eq!(readable_code(libc::SIGILL, 0, 0), None);
    }

    #[test]
    fn a_fault_in_fetching_shows_no_bytes() {
        assert_eq!(readable_code(libc::SIGSEGV, 0x10, 0x5000), Some((0x5000, 0x5010)));
        assert_eq!(readable_code(libc::SIGSEGV, 0x5004, 0x5000), None);
        assert_eq!(readable_code(libc::SIGSEGV, 0x6000, 0x5ffc), None);
    }
}
