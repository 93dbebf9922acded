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
/// where the fault it takes is caught. Signals arriving meanwhile are
/// delivered (the program's handlers run on the borrowed stack). Returns
/// `rax`.
///
/// The thread's registers (`orig_rax` included, so that a system call it
/// was interrupted in is restarted as it would have been) and the stack
/// bytes written are restored afterwards. If the call does not return
/// within `limit` it is left running and the error says so: its state
/// cannot be put back while it holds whatever it holds.
pub fn call(mem: &Mem, tid: Pid, func: u64, args: &[u64], data: &[u8], what: &str, limit: Duration) -> Result<u64> {
    let pid = mem.pid();
    let saved = ptrace::getregs(tid).map_err(|e| AttachError::Other(format!("registers of {tid}: {e}")))?;
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
            ptrace::setregs(tid, saved).ok();
            mem.write(lo, &old)?;
            return Err(AttachError::Other(format!(
                "{what} faulted in process {pid} at {:#x}; the thread was put back",
                now.rip
            )));
        }
        deliver = pending_of(&st);
    };
    mem.write(lo, &old)?;
    ptrace::setregs(tid, saved).map_err(|e| AttachError::Other(format!("restoring registers of {tid}: {e}")))?;
    Ok(result)
}

/// An argument of [`call`] that stands for the address of its `data`.
pub const DATA: u64 = u64::MAX - 0xda7a;
