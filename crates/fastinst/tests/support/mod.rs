//! An instrumented function as `-finstrument-functions` would make it, for
//! the tests that call the hooks from Rust.

/// A function with `-finstrument-functions`' two hook calls: the entry
/// hook first, the exit hook last, each a direct `call` with the
/// function's address and a call site. The function's address goes
/// through memory, so its load is never rewritten to pass a probe id, and
/// the work between the calls is a loop the compiler cannot drop.
#[inline(never)]
pub extern "C" fn instrumented(n: u64) -> u64 {
    let this_fn = std::hint::black_box(instrumented as *const () as u64);
    let call_site = std::hint::black_box(1u64);
    // SAFETY: the hook takes (this_fn, call_site) in the C ABI and returns;
    // it clobbers what a C function may.
    unsafe {
        core::arch::asm!(
            "call {f}",
            f = sym fastinst::hooks::__cyg_profile_func_enter,
            in("rdi") this_fn, in("rsi") call_site,
            clobber_abi("C"),
        )
    };
    let mut x = 0u64;
    for i in 0..std::hint::black_box(n) {
        x = x.wrapping_mul(31).wrapping_add(i);
    }
    let this_fn = std::hint::black_box(instrumented as *const () as u64);
    // SAFETY: as above.
    unsafe {
        core::arch::asm!(
            "call {f}",
            f = sym fastinst::hooks::__cyg_profile_func_exit,
            in("rdi") this_fn, in("rsi") call_site,
            clobber_abi("C"),
        )
    };
    x
}
