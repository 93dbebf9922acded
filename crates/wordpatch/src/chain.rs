//! Handing a signal that is not ours to the disposition found before ours,
//! for this crate's handlers (SIGTRAP for the INT3 lock, SIGSEGV for pages
//! made read-only again).

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
/// signal, the faulting address, the instruction pointer and the 16 code
/// bytes there. A signal raised again from a handler is not logged by the
/// kernel as a fault is, and a crash in code being patched is worth its
/// bytes. No allocation: the line is built in a buffer on the stack and
/// written with one `write`.
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
    // The bytes at ip only where the fault was not in fetching them.
    if ip != 0 && (addr < ip || addr >= ip + 16) {
        line.push(b", code");
        for i in 0..16 {
            line.push(b" ");
            // SAFETY: the instruction at ip was fetched and decoded (the
            // fault is a data access elsewhere), so its page is mapped and
            // readable; 16 bytes may cross into the next page only where
            // an instruction does.
            line.hex(u64::from(unsafe { std::ptr::read_volatile((ip + i) as *const u8) }));
        }
    }
    line.push(b"\n");
    line.write_to(2);
}
