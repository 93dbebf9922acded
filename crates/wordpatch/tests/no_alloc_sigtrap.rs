//! The SIGTRAP handler allocates nothing: a thread that runs into a
//! straddling patch in flight (its `int3` in place) is sent through the
//! handler while its allocations are counted, many times. A test binary of
//! its own: its allocator counts, and signal dispositions are process-wide.

use testkit::alloc::{allocations_in, Counting};
use wordpatch::*;

#[global_allocator]
static ALLOC: Counting = Counting;

#[test]
fn a_thread_sent_through_the_trap_handler_allocates_nothing() {
    assert_eq!(
        allocations_in(|| drop(std::hint::black_box(vec![1u8; 9]))),
        1,
        "the counter counts"
    );
    install_trap_handler().unwrap();
    let mut mm = memmap2::MmapOptions::new().len(PAGE_SIZE).map_anon().unwrap();
    mm.fill(0xCC);
    // `mov eax, 1; ret` at 126: the mov straddles the line at 128.
    mm[126..132].copy_from_slice(&[0xB8, 1, 0, 0, 0, 0xC3]);
    let m = mm.make_exec().unwrap();
    let site = m.as_ptr().wrapping_add(126) as *mut u8;
    assert!(is_straddler(site as usize, 5));
    // SAFETY: `mov eax, imm32; ret` is a C-ABI function at every step of
    // a patch between two such movs (a thread at the int3 is sent on by
    // the handler).
    let f: extern "C" fn() -> u32 = unsafe { std::mem::transmute(site) };
    const RUNS: u32 = 2_000;
    let before = traps_handled();
    let mut allocations = 0;
    for i in 0..RUNS {
        let (old, new) = if i % 2 == 0 { (1u8, 7u8) } else { (7, 1) };
        // SAFETY: mov eax, imm32 -> mov eax, imm32 at a site of ours; the
        // patch stays in flight (its int3 in place) until a trap or a
        // later call finishes it.
        unsafe {
            start_patch(
                site,
                &[0xB8, new, 0, 0, 0],
                &PatchOptions {
                    expected: Some(&[0xB8, old, 0, 0, 0]),
                    wait: Some(Wait::Tmax(1_000)),
                },
            )
        }
        .unwrap();
        let mut got = 0;
        allocations += allocations_in(|| got = f());
        assert!(got == u32::from(old) || got == u32::from(new), "run {i}: {got}");
        while finish_patch(site) == Progress::InFlight {
            std::hint::spin_loop();
        }
    }
    let traps = traps_handled() - before;
    assert!(
        traps >= u64::from(RUNS),
        "{traps} traps handled in {RUNS} runs: the int3 was not in place"
    );
    assert_eq!(allocations, 0, "allocations in {traps} trips through the trap handler");
}
