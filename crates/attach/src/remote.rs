//! Calling a function of a stopped process on one of its threads, and
//! putting back every register and stack byte the call used.

use crate::error::{AttachError, Result};
use crate::mem::Mem;
use crate::threads::{pending_of, wait_stop};
use nix::sys::ptrace;
use nix::sys::signal::Signal;
use nix::sys::wait::WaitStatus;
use nix::unistd::Pid;
use std::time::{Duration, Instant};

/// Bytes below the stack pointer left alone: the System V red zone and
/// more.
const SKIP: u64 = 1024;

/// Calls `func(args...)` on stopped, traced thread `tid` of the process
/// whose memory `mem` is, with `data` copied below its stack first (`args` may point into
/// it: [`DATA`] stands for its address). The call returns to address 0,
/// where the fault it takes is caught. Signals arriving meanwhile stay
/// pending until the call is over (the thread's signal mask is
/// all-blocked for it). Returns `rax`.
///
/// The thread's registers (`orig_rax` included, so that a system call it
/// was interrupted in is restarted as it would have been) and the stack
/// bytes written are restored afterwards. One system call cannot restart
/// as it would have: one that restarts from the kernel's per-thread record
/// (`-ERESTART_RESTARTBLOCK`: `nanosleep`, `poll`, a timed futex wait),
/// which any `nanosleep` in the call resets. Restored as it stood, it
/// returned at once: a program attached while its main thread slept 8 s
/// ran 0.77 s. It is issued again instead, with its own arguments, as the
/// kernel does for calls that restart from their registers: a relative
/// timeout then runs again from its start. (`attach` borrows such a
/// thread only when no other may be.) If the call does not return
/// within `limit` it is left running and the error says so: its state
/// cannot be put back while it holds whatever it holds.
pub fn call(mem: &Mem, tid: Pid, func: u64, args: &[u64], data: &[u8], what: &str, limit: Duration) -> Result<u64> {
    let pid = mem.pid();
    let saved = ptrace::getregs(tid).map_err(|e| AttachError::Other(format!("registers of {tid}: {e}")))?;
    // The vector and floating-point registers too: the call runs code
    // that uses them (`memcpy`, the runtime's start), and a thread stopped
    // in the middle of vector code (a hash table's SSE2 probe, say) would
    // go on with another's values in them.
    let mut xstate = Xstate::save(tid)?;
    let data_at = (saved.rsp - SKIP - data.len() as u64) & !15;
    // At a function's first instruction, rsp + 8 is 16-byte aligned.
    let ret_slot = ((data_at - 64) & !15) - 8;
    let lo = ret_slot;
    let mut old = vec![0u8; (data_at + data.len() as u64 - lo) as usize];
    mem.read(lo, &mut old)?;
    mem.write(data_at, data)?;
    mem.write(ret_slot, &0u64.to_le_bytes())?;
    let mut r = saved;
    r.rip = func;
    r.rsp = ret_slot;
    r.rax = 0;
    // Not in a system call: the kernel must not restart one at `func`.
    r.orig_rax = u64::MAX;
    let regs = [&mut r.rdi, &mut r.rsi, &mut r.rdx, &mut r.rcx, &mut r.r8, &mut r.r9];
    for (reg, &a) in regs.into_iter().zip(args) {
        *reg = if a == DATA { data_at } else { a };
    }
    let held = SignalsHeld::hold(tid)?;
    let restored = reissued(saved);
    ptrace::setregs(tid, r).map_err(|e| AttachError::Other(format!("setting registers of {tid}: {e}")))?;
    let until = Instant::now() + limit;
    let mut deliver: Option<Signal> = None;
    let result = loop {
        ptrace::cont(tid, deliver).map_err(|e| AttachError::Other(format!("resuming {tid}: {e}")))?;
        let left = until.saturating_duration_since(Instant::now());
        let st = match wait_stop(tid, left) {
            Ok(Some(st)) => st,
            Ok(None) => return Err(AttachError::Exited(pid)),
            Err(_) => {
                return Err(AttachError::Timeout {
                    pid,
                    what: what.into(),
                    secs: limit.as_secs(),
                })
            }
        };
        if let WaitStatus::Stopped(_, Signal::SIGSEGV) = st {
            let now = ptrace::getregs(tid).map_err(|e| AttachError::Other(format!("registers of {tid}: {e}")))?;
            if now.rip == 0 {
                break now.rax;
            }
            // A fault of the call itself: put the thread back and say so.
            ptrace::setregs(tid, restored).ok();
            xstate.restore(tid).ok();
            held.release()?;
            mem.write(lo, &old)?;
            return Err(AttachError::Other(format!(
                "{what} faulted in process {pid} at {:#x}; the thread was put back",
                now.rip
            )));
        }
        deliver = pending_of(&st);
    };
    mem.write(lo, &old)?;
    ptrace::setregs(tid, restored).map_err(|e| AttachError::Other(format!("restoring registers of {tid}: {e}")))?;
    xstate.restore(tid)?;
    held.release()?;
    Ok(result)
}

/// A thread's extended register state (`NT_X86_XSTATE`: x87, SSE, AVX,
/// AVX-512 and the rest its XSAVE area holds), as the kernel gives it.
pub struct Xstate(Vec<u8>);

/// `NT_X86_XSTATE`, the regset of the XSAVE area.
const NT_X86_XSTATE: libc::c_int = 0x202;

impl Xstate {
    /// Reads stopped, traced thread `tid`'s XSAVE area.
    pub fn save(tid: Pid) -> Result<Xstate> {
        // Larger than any XSAVE area (AVX-512 with AMX tiles is ~11 KiB);
        // the kernel says how much it wrote.
        let mut buf = vec![0u8; 16 << 10];
        let n = regset(libc::PTRACE_GETREGSET, tid, &mut buf)
            .map_err(|e| AttachError::Other(format!("vector registers of {tid}: {e}")))?;
        buf.truncate(n);
        Ok(Xstate(buf))
    }

    /// Writes the saved area back to stopped, traced thread `tid`.
    pub fn restore(&mut self, tid: Pid) -> Result<()> {
        regset(libc::PTRACE_SETREGSET, tid, &mut self.0)
            .map(|_| ())
            .map_err(|e| AttachError::Other(format!("restoring vector registers of {tid}: {e}")))
    }
}

/// `PTRACE_GETREGSET` or `PTRACE_SETREGSET` of `NT_X86_XSTATE` with
/// `buf`; the bytes the kernel read or wrote.
fn regset(request: libc::c_uint, tid: Pid, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: the kernel reads or writes at most `iov_len` bytes of the
    // buffer `iov` describes, which `buf` owns, and sets `iov_len` to how
    // many.
    let rc = unsafe {
        libc::ptrace(
            request,
            tid.as_raw(),
            NT_X86_XSTATE as usize as *mut libc::c_void,
            &mut iov as *mut libc::iovec,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(iov.iov_len)
}

/// The registers to put back after a call: `saved`, but a system call
/// stopped with `-ERESTART_RESTARTBLOCK` is set to be issued again (its
/// number in `rax`, `rip` back on its 2-byte `syscall`), since the record
/// it would restart from may not survive the call (see [`call`]).
fn reissued(saved: libc::user_regs_struct) -> libc::user_regs_struct {
    const ERESTART_RESTARTBLOCK: i64 = -516;
    let mut r = saved;
    if (saved.orig_rax as i64) >= 0 && saved.rax as i64 == ERESTART_RESTARTBLOCK {
        r.rax = saved.orig_rax;
        r.rip -= 2;
    }
    r
}

/// A borrowed thread's signal mask, all-blocked while it runs a call.
///
/// A program's handler run in the middle of the call would run on the
/// borrowed stack, inside `dlopen` or the runtime's start, and one that
/// leaves by `siglongjmp` would abandon the call with the thread's
/// registers never put back. Held pending instead, the signals are
/// delivered once the thread is back in its own state, as if they had come
/// then. (`SIGKILL` and `SIGSTOP` cannot be blocked; a fault of the call
/// itself is still reported, the kernel unblocks it.)
struct SignalsHeld {
    tid: Pid,
    mask: u64,
}

const PTRACE_GETSIGMASK: libc::c_uint = 0x420a;
const PTRACE_SETSIGMASK: libc::c_uint = 0x420b;

fn sigmask(op: libc::c_uint, tid: Pid, mask: &mut u64) -> Result<()> {
    // SAFETY: both requests read or write the 8 bytes of `mask`, the size
    // passed, of a thread this process traces and has stopped.
    let rc = unsafe { libc::ptrace(op, tid.as_raw(), std::mem::size_of::<u64>(), mask as *mut u64) };
    if rc == -1 {
        return Err(AttachError::Other(format!(
            "signal mask of {tid}: {}",
            std::io::Error::last_os_error()
        )));
    }
    Ok(())
}

impl SignalsHeld {
    fn hold(tid: Pid) -> Result<SignalsHeld> {
        let mut mask = 0;
        sigmask(PTRACE_GETSIGMASK, tid, &mut mask)?;
        let mut all = u64::MAX;
        sigmask(PTRACE_SETSIGMASK, tid, &mut all)?;
        Ok(SignalsHeld { tid, mask })
    }

    fn release(mut self) -> Result<()> {
        sigmask(PTRACE_SETSIGMASK, self.tid, &mut self.mask)
    }
}

/// An argument of [`call`] that stands for the address of its `data`.
pub const DATA: u64 = u64::MAX - 0xda7a;
