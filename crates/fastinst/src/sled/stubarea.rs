//! Stub areas: read+execute pages of per-site stubs within `call rel32`
//! reach of the code that calls them, with their counters after them in
//! read+write pages. A sled's stub ends in the entry trampoline
//! (`super::trampoline`); a `-finstrument-functions` entry call's
//! (`crate::callcount`) in the entry hook. Both may begin with the
//! counting path (`super::counter`).

use super::counter::{Counter, COUNTER_LEN};

/// Bytes per stub: room for the counting path.
pub(crate) const STUB_LEN: usize = 96;
/// Bytes at the start of a stub area before the first stub (the slot).
pub(crate) const AREA_HEADER: usize = 16;

/// The bytes of the stub for entry probe `id` at `stub`, jumping through the
/// slot at `slot`.
pub(crate) fn stub_bytes(id: u32, stub: usize, slot: usize) -> [u8; STUB_LEN] {
    let mut b = [0xCC; STUB_LEN];
    put_tail(&mut b, 0, id, stub, slot);
    b
}

/// Writes `push id; jmp [rip+slot]` at `at` of the stub at `stub`; returns
/// where it ends.
fn put_tail(b: &mut [u8; STUB_LEN], at: usize, id: u32, stub: usize, slot: usize) -> usize {
    b[at] = 0x68; // push imm32 (sign-extended; ids are < 2^31)
    b[at + 1..at + 5].copy_from_slice(&id.to_le_bytes());
    b[at + 5] = 0xFF; // jmp [rip + disp32]
    b[at + 6] = 0x25;
    put_rel(b, at + 7, stub + at + 11, slot);
    at + 11
}

/// Writes at `at` the 32-bit displacement from `rip` (the end of the
/// instruction holding it) to `target`.
fn put_rel(b: &mut [u8; STUB_LEN], at: usize, rip: usize, target: usize) {
    let disp = target as i64 - rip as i64;
    b[at..at + 4].copy_from_slice(&(disp as i32).to_le_bytes());
}

/// Where a counting stub sends the calls its counting path does not keep
/// (disarmed, drawn, or of a thread with no clock yet).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Tail {
    /// A sled's: `push id; jmp [rip+slot]`, the entry trampoline.
    Sled(u32),
    /// A `-finstrument-functions` entry call's (`crate::callcount`):
    /// `jmp [rip+slot]`, the entry hook itself, which finds the call's
    /// site by the return address the call pushed, as if called directly.
    Hook,
}

/// The bytes of a counting stub (`super::counter`) at `stub` ending in
/// `tail`, with its counter at `counter`, the thread clock's slot at
/// `fs:[clock]`, and the slot at `slot`:
///
/// ```text
///  0  cmp qword [rip+next], 0      ; lane 0's: disarmed,
///  8  je tail                      ;   the full hook
/// 10  push rax
/// 11  push rcx
/// 12  mov rcx, fs:[clock]          ; this thread's ThreadClock
/// 21  test rcx, rcx
/// 24  jz no_clock
/// 26  inc qword [rcx+fast_calls]   ; a drawn call is charged it too
/// 30  mov rcx, [rcx+lane]          ; this thread's lane...
/// 34  lea rax, [rip+counter]
/// 41  add rcx, rax                 ; ...in this counter
/// 44  mov eax, 1
/// 49  lock xadd [rcx+8], rax       ; rax: this call's index in its lane
/// 55  cmp rax, [rcx]
/// 58  jae pop_tail                 ; the drawn call (or a racer)
/// 60  pop rcx; pop rax
/// 62  ret
/// 63  lock inc qword [rip+calls]   ; no_clock: lane 0; the hook makes one
/// 71  pop rcx; pop rax             ; pop_tail
/// 73  push id; jmp [rip+slot]      ; tail (a sled's; a hook's: jmp [rip+slot])
/// ```
pub(crate) fn counting_stub_bytes(tail: Tail, stub: usize, slot: usize, counter: usize, clock: i32) -> [u8; STUB_LEN] {
    let mut b = [0xCC; STUB_LEN];
    b[0..3].copy_from_slice(&[0x48, 0x83, 0x3D]);
    put_rel(&mut b, 3, stub + 8, counter);
    b[7] = 0x00;
    b[8..10].copy_from_slice(&[0x74, 73 - 10]);
    b[10..12].copy_from_slice(&[0x50, 0x51]);
    b[12..17].copy_from_slice(&[0x64, 0x48, 0x8B, 0x0C, 0x25]);
    b[17..21].copy_from_slice(&clock.to_le_bytes());
    b[21..24].copy_from_slice(&[0x48, 0x85, 0xC9]);
    b[24..26].copy_from_slice(&[0x74, 63 - 26]);
    b[26..30].copy_from_slice(&[0x48, 0xFF, 0x41, crate::clock::FAST_CALLS_OFFSET]);
    b[30..34].copy_from_slice(&[0x48, 0x8B, 0x49, crate::clock::LANE_OFFSET]);
    b[34..37].copy_from_slice(&[0x48, 0x8D, 0x05]);
    put_rel(&mut b, 37, stub + 41, counter);
    b[41..44].copy_from_slice(&[0x48, 0x01, 0xC1]);
    b[44..49].copy_from_slice(&[0xB8, 1, 0, 0, 0]);
    b[49..55].copy_from_slice(&[0xF0, 0x48, 0x0F, 0xC1, 0x41, 0x08]);
    b[55..58].copy_from_slice(&[0x48, 0x3B, 0x01]);
    b[58..60].copy_from_slice(&[0x73, 71 - 60]);
    b[60..63].copy_from_slice(&[0x59, 0x58, 0xC3]);
    b[63..67].copy_from_slice(&[0xF0, 0x48, 0xFF, 0x05]);
    put_rel(&mut b, 67, stub + 71, counter + 8);
    b[71..73].copy_from_slice(&[0x59, 0x58]);
    match tail {
        Tail::Sled(id) => {
            let end = put_tail(&mut b, 73, id, stub, slot);
            debug_assert_eq!(end, 84);
        }
        Tail::Hook => {
            b[73] = 0xFF; // jmp [rip + disp32]
            b[74] = 0x25;
            put_rel(&mut b, 75, stub + 79, slot);
        }
    }
    b
}

/// A stub made by [`make_stubs`]: its address, and its counter if it
/// counts.
pub(crate) type Made = (usize, Option<&'static Counter>);

/// A read+execute area of `n` counting stubs ending in [`Tail::Hook`]
/// (the `-finstrument-functions` entry hook at `hook`), within `call
/// rel32` reach of every address in `[lo, hi]`, each with its counter.
/// `None` when no memory near enough could be mapped, or the clock's slot
/// cannot be addressed from generated code.
pub(crate) fn make_hook_stubs(lo: usize, hi: usize, n: usize, hook: usize) -> Option<Vec<(usize, &'static Counter)>> {
    let off = crate::arch::tls::clock_offset()?;
    let made = make_area(lo, hi, n, n, hook, |at, slot, counter| {
        let c = counter().expect("a counter per stub");
        (
            counting_stub_bytes(Tail::Hook, at, slot, c as *const Counter as usize, off),
            Some(c),
        )
    })?;
    Some(
        made.into_iter()
            .map(|(at, c)| (at, c.expect("a counter per stub")))
            .collect(),
    )
}

/// Maps an area of `stubs` stubs and `counters` counters near `[lo,
/// hi]`, its slot holding `target`, and fills each stub with what `fill`
/// makes of its address, the slot's, and a way to take the next counter.
pub(crate) fn make_area(
    lo: usize,
    hi: usize,
    stubs: usize,
    counters: usize,
    target: usize,
    mut fill: impl FnMut(
        usize,
        usize,
        &mut dyn FnMut() -> Option<&'static Counter>,
    ) -> ([u8; STUB_LEN], Option<&'static Counter>),
) -> Option<Vec<Made>> {
    let code = (AREA_HEADER + STUB_LEN * stubs).div_ceil(wordpatch::PAGE_SIZE) * wordpatch::PAGE_SIZE;
    let size = code + COUNTER_LEN * counters;
    let area = callpatch::map_near(lo, hi, 5, size)?;
    let slot = area;
    let mut made = Vec::with_capacity(stubs);
    let mut counter = area + code;
    let end = area + size;
    // SAFETY: `area` is a fresh private read+write mapping of at least
    // `size` bytes that nothing else knows about yet. The counters' part is
    // zeroed, a valid disarmed `Counter` (atomics only) at each 64-byte
    // step, stays read+write and is never unmapped, so `&'static` holds.
    unsafe {
        *(slot as *mut u64) = target as u64;
        for k in 0..stubs {
            let at = area + AREA_HEADER + STUB_LEN * k;
            let mut take = || {
                (counter + COUNTER_LEN <= end).then(|| {
                    let c = counter;
                    counter += COUNTER_LEN;
                    &*(c as *const Counter)
                })
            };
            let (bytes, c) = fill(at, slot, &mut take);
            made.push((at, c));
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), at as *mut u8, STUB_LEN);
        }
    }
    // SAFETY: as above; after this the stubs are never written again.
    if unsafe { libc::mprotect(area as *mut libc::c_void, code, libc::PROT_READ | libc::PROT_EXEC) } != 0 {
        let len = size.div_ceil(wordpatch::PAGE_SIZE) * wordpatch::PAGE_SIZE;
        // SAFETY: our own mapping, not yet referenced by any code.
        unsafe { libc::munmap(area as *mut libc::c_void, len) };
        return None;
    }
    AREAS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push((area, area + code));
    Some(made)
}

/// Every stub area's code, `[start, end)`: never unmapped.
static AREAS: std::sync::Mutex<Vec<(usize, usize)>> = std::sync::Mutex::new(Vec::new());

/// Every stub area's code, `[start, end)`: the runtime's code, whose time
/// (a CPU sample in a counting path) is the profiler's, not the program's.
pub(crate) fn stub_areas() -> Vec<(usize, usize)> {
    AREAS.lock().unwrap_or_else(|e| e.into_inner()).clone()
}
