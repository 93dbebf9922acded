//! Patching semantics on real code pages: every offset and length, every
//! error, the asynchronous state machine, flush, the finisher, contention.

use std::sync::{Arc, Barrier, Mutex, MutexGuard};
use std::time::Duration;
use wordpatch::*;

/// An executable, read-only page (wordpatch must make it writable itself),
/// forgotten by wordpatch before it is unmapped.
struct CodePage(memmap2::Mmap);

impl std::ops::Deref for CodePage {
    type Target = memmap2::Mmap;
    fn deref(&self) -> &memmap2::Mmap {
        &self.0
    }
}

impl Drop for CodePage {
    fn drop(&mut self) {
        forget_pages(self.0.as_ptr(), self.0.len());
    }
}

fn code_page(fill: u8) -> CodePage {
    let mut m = memmap2::MmapOptions::new().len(PAGE_SIZE).map_anon().unwrap();
    m.fill(fill);
    CodePage(m.make_exec().unwrap())
}

/// `flush` and the `Finisher` complete every patch in the process, by design;
/// tests that need a patch to stay in flight, and tests that drive all
/// patches, take this lock so they do not run at the same time.
static GLOBAL_DRIVERS: Mutex<()> = Mutex::new(());

fn exclusive() -> MutexGuard<'static, ()> {
    GLOBAL_DRIVERS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Starts an asynchronous patch that states no expected bytes. Every caller
/// patches a page nothing executes, or swaps `mov eax, imm32` for another
/// immediate (same length, same boundaries).
fn start(site: *mut u8, new: &[u8], wait: Wait) -> Result<Progress, Error> {
    let o = PatchOptions {
        expected: None,
        wait: Some(wait),
    };
    // SAFETY: see above: the callers' sites are never run, or are replaced
    // by an instruction of the same length.
    unsafe { start_patch(site, new, &o) }
}

/// A page holding `nop; mov eax, 1; ret` with the `mov` at `site_off`:
/// the page, the function, and the `mov` (the site tests patch).
fn mov_eax_function(site_off: usize) -> (CodePage, extern "C" fn() -> u32, *mut u8) {
    let mut mm = memmap2::MmapOptions::new().len(PAGE_SIZE).map_anon().unwrap();
    mm.fill(0xCC);
    mm[site_off - 1] = 0x90;
    mm[site_off..site_off + 6].copy_from_slice(&[0xB8, 1, 0, 0, 0, 0xC3]);
    let m = CodePage(mm.make_exec().unwrap());
    // SAFETY: `nop; mov eax, imm32; ret` is a C-ABI function.
    let f: extern "C" fn() -> u32 = unsafe { std::mem::transmute(m.as_ptr().wrapping_add(site_off - 1)) };
    let site = m.as_ptr().wrapping_add(site_off) as *mut u8;
    (m, f, site)
}

fn bytes(m: &CodePage) -> Vec<u8> {
    m.to_vec()
}

#[test]
fn every_offset_and_length_patches_exactly_its_bytes() {
    let m = code_page(0x90);
    let base = m.as_ptr() as *mut u8;
    let mut model = bytes(&m);
    let mut n = 0u8;
    for off in 64..192usize {
        for len in 1..=MAX_PATCH_LEN {
            n = n.wrapping_add(1);
            if n == 0xCC {
                n = 1;
            }
            let new: Vec<u8> = (0..len as u8)
                .map(|i| n ^ (i * 17))
                .map(|b| if b == 0xCC { 1 } else { b })
                .collect();
            let old = model[off..off + len].to_vec();
            let o = PatchOptions {
                expected: Some(&old),
                wait: Some(Wait::Tmax(0)),
            };
            // SAFETY: nothing executes this page.
            unsafe { patch_with(base.add(off), &new, &o) }.unwrap();
            model[off..off + len].copy_from_slice(&new);
            assert_eq!(bytes(&m), model, "offset {off} len {len}");
            // SAFETY: address inside the page.
            assert_eq!(finish_patch(unsafe { base.add(off) }), Progress::Done);
        }
    }
}

#[test]
fn errors() {
    let m = code_page(0x90);
    let p = m.as_ptr() as *mut u8;
    // SAFETY: for every call here, nothing executes these pages.
    unsafe {
        assert_eq!(patch(p, &[]), Err(Error::InvalidLength(0)));
        assert_eq!(patch(p, &[0x90; 9]), Err(Error::InvalidLength(9)));
        let o = PatchOptions {
            expected: Some(&[0x90; 2]),
            wait: None,
        };
        assert_eq!(patch_with(p, &[1, 2, 3], &o), Err(Error::InvalidLength(2)));
        let data = Box::new([0u8; 64]);
        assert!(matches!(
            patch(data.as_ptr() as *mut u8, &[1]),
            Err(Error::NotExecutable { .. })
        ));
        assert!(matches!(patch(16 as *mut u8, &[1]), Err(Error::NotMapped { .. })));
        // Unexpected: non-straddler (atomic check) and straddler; nothing written.
        let o = PatchOptions {
            expected: Some(&[1, 2]),
            wait: None,
        };
        assert!(matches!(
            patch_with(p.add(8), &[3, 4], &o),
            Err(Error::Unexpected { .. })
        ));
        let o = PatchOptions {
            expected: Some(&[1, 2, 3, 4]),
            wait: Some(Wait::Tmax(0)),
        };
        assert!(matches!(
            patch_with(p.add(62), &[3, 4, 5, 6], &o),
            Err(Error::Unexpected { .. })
        ));
        assert_eq!(bytes(&m), vec![0x90; PAGE_SIZE]);
        // A straddler may not start with INT3.
        assert!(matches!(
            patch(p.add(62), &[0xCC, 1, 2, 3]),
            Err(Error::StartsWithInt3 { .. })
        ));
    }
}

#[test]
fn async_state_machine_steps() {
    let _g = exclusive();
    let m = code_page(0x90);
    let p = m.as_ptr() as *mut u8;
    let site = p.wrapping_add(128 - 3); // 3|2 split
                                        // Long enough that the checks right after a step come before its wait
                                        // ends; the test then waits for the TSC itself to pass it, whatever
                                        // the TSC's rate.
    const TICKS: u64 = 60_000_000;
    let wait = Wait::Tmax(TICKS);
    // Past a wait that began at or just after `t0` (with a margin for the
    // call that began it).
    let sleep_past = |t0: u64| {
        while wordpatch::tsc::now().wrapping_sub(t0) <= TICKS + TICKS / 10 {
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    let new = [1u8, 2, 3, 4, 5];
    let o = PatchOptions {
        expected: Some(&[0x90; 5]),
        wait: Some(wait),
    };
    let started = wordpatch::tsc::now();
    // SAFETY: nothing executes this page.
    assert_eq!(unsafe { start_patch(site, &new, &o) }, Ok(Progress::InFlight));
    let at = |i: usize| bytes(&m)[128 - 3 + i];
    // FIRST_WAIT: locked, back untouched.
    assert_eq!(at(0), 0xCC);
    assert_eq!((at(3), at(4)), (0x90, 0x90));
    assert_eq!(finish_patch(site), Progress::InFlight, "wait not elapsed");
    assert_eq!(at(3), 0x90);
    // A second patch of the same site is refused while it is locked...
    assert!(matches!(
        // SAFETY: as above.
        unsafe { start_patch(site, &new, &PatchOptions::default()) },
        Err(Error::SiteLocked { .. })
    ));
    // ...and so is an overlapping one at another start, straddler or not.
    // SAFETY: as above.
    unsafe {
        assert!(matches!(
            patch(p.add(128 - 2), &[7, 7, 7]),
            Err(Error::OverlapInFlight { .. })
        ));
        assert!(matches!(patch(p.add(128), &[7]), Err(Error::OverlapInFlight { .. })));
        assert!(matches!(
            patch(p.add(128 - 8), &[7; 6]),
            Err(Error::OverlapInFlight { .. })
        ));
        // Disjoint bytes in the same lines are fine.
        patch(p.add(128 + 2), &[8]).unwrap();
        patch(p.add(128 - 8), &[8; 5]).unwrap();
    }
    sleep_past(started);
    // SECOND_WAIT: back written, still locked.
    let second = wordpatch::tsc::now();
    assert_eq!(finish_patch(site), Progress::InFlight);
    assert_eq!(at(0), 0xCC);
    assert_eq!((at(3), at(4)), (4, 5));
    assert_eq!((at(1), at(2)), (0x90, 0x90), "front waits for the second step");
    assert_eq!(finish_patch(site), Progress::InFlight, "second wait not elapsed");
    sleep_past(second);
    // FINISHED.
    assert_eq!(finish_patch(site), Progress::Done);
    assert_eq!(&bytes(&m)[125..130], &new);
    assert_eq!(finish_patch(site), Progress::Done, "finishing a finished patch is Done");
}

#[test]
fn flush_completes_many_in_flight() {
    let _g = exclusive();
    let m = code_page(0x90);
    let p = m.as_ptr() as *mut u8;
    let lines = PAGE_SIZE / CACHE_LINE - 1;
    for l in 1..=lines {
        let r = start(p.wrapping_add(l * 64 - 2), &[1, 2, 3, 4], Wait::Tmax(3000));
        assert_eq!(r, Ok(Progress::InFlight));
    }
    assert!(pending() >= lines);
    flush();
    for l in 1..=lines {
        assert_eq!(&bytes(&m)[l * 64 - 2..l * 64 + 2], &[1, 2, 3, 4]);
    }
}

#[test]
fn finisher_completes_in_background() {
    let _g = exclusive();
    let m = code_page(0x90);
    let p = m.as_ptr() as *mut u8;
    let f = Finisher::spawn().unwrap();
    for l in 1..8 {
        start(p.wrapping_add(l * 64 - 1), &[9, 9], Wait::Tmax(3000)).unwrap();
    }
    let t = std::time::Instant::now();
    while (1..8).any(|l| bytes(&m)[l * 64 - 1] != 9) {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "finisher did not complete the patches"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    f.stop();
}

#[test]
fn synccore_patch() {
    let _g = exclusive();
    if ensure_sync_core().is_err() {
        eprintln!("membarrier SYNC_CORE unavailable here; skipped");
        return;
    }
    let m = code_page(0x90);
    let p = m.as_ptr() as *mut u8;
    let o = PatchOptions {
        expected: Some(&[0x90; 4]),
        wait: Some(Wait::SyncCore),
    };
    // SAFETY: nothing executes this page.
    unsafe { patch_with(p.add(62), &[1, 2, 3, 4], &o) }.unwrap();
    assert_eq!(&bytes(&m)[62..66], &[1, 2, 3, 4]);
    // Async SyncCore patches share barriers in flush.
    for l in 2..40 {
        start(p.wrapping_add(l * 64 - 1), &[5, 6], Wait::SyncCore).unwrap();
    }
    flush();
    assert!((2..40).all(|l| bytes(&m)[l * 64 - 1..l * 64 + 1] == [5, 6]));
}

#[test]
fn disjoint_sites_patch_concurrently() {
    let m = Arc::new(code_page(0x90));
    let threads = 8;
    let hs: Vec<_> = (0..threads)
        .map(|t| {
            let m = m.clone();
            std::thread::spawn(move || {
                let p = m.as_ptr() as *mut u8;
                for i in 0..2000u32 {
                    let line = 1 + t * 4 + (i as usize % 4);
                    let v = (i % 200) as u8 + 1;
                    // SAFETY: nothing executes this page; each thread owns its lines.
                    unsafe {
                        patch_with(
                            p.add(line * 64 - 2),
                            &[v; 4],
                            &PatchOptions {
                                expected: None,
                                wait: Some(Wait::Tmax(0)),
                            },
                        )
                    }
                    .unwrap();
                    // SAFETY: as above.
                    unsafe { patch(p.add(line * 64 + 8), &[v; 8]) }.unwrap();
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    let p = m.as_ptr();
    for line in 1..=32 {
        // SAFETY: address inside the page.
        assert_eq!(finish_patch(unsafe { p.add(line * 64 - 2) }), Progress::Done);
        assert_ne!(bytes(&m)[line * 64 - 2], 0xCC);
    }
}

#[test]
fn same_site_contention_always_has_a_winner() {
    let m = Arc::new(code_page(0x90));
    let threads = 6;
    let rounds = 300;
    let barrier = Arc::new(Barrier::new(threads));
    let results = Arc::new(std::sync::Mutex::new(vec![0u32; rounds]));
    let hs: Vec<_> = (0..threads)
        .map(|t| {
            let (m, barrier, results) = (m.clone(), barrier.clone(), results.clone());
            std::thread::spawn(move || {
                let site = (m.as_ptr() as *mut u8).wrapping_add(3 * 64 - 2);
                for r in 0..rounds {
                    barrier.wait();
                    let v = [t as u8 + 1, 2, 3, 4];
                    // SAFETY: nothing executes this page.
                    match unsafe {
                        patch_with(
                            site,
                            &v,
                            &PatchOptions {
                                expected: None,
                                wait: Some(Wait::Tmax(2000)),
                            },
                        )
                    } {
                        Ok(()) => results.lock().unwrap()[r] += 1,
                        Err(Error::SiteLocked { .. }) => {}
                        Err(e) => panic!("unexpected error {e}"),
                    }
                    barrier.wait();
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    let r = results.lock().unwrap();
    assert!(r.iter().all(|&wins| wins >= 1), "a round with no winner: {r:?}");
    // SAFETY: address inside the page.
    assert_eq!(finish_patch(unsafe { m.as_ptr().add(3 * 64 - 2) }), Progress::Done);
    assert_ne!(bytes(&m)[3 * 64 - 2], 0xCC, "site left locked");
}

#[test]
fn a_thread_running_into_its_own_pending_patch_completes_it() {
    let _g = exclusive();
    let (_m, f, site) = mov_eax_function(256 - 2); // 2|3 split
    assert_eq!(f(), 1);
    let before = traps_handled();
    let r = start(site, &[0xB8, 2, 0, 0, 0], Wait::Tmax(30_000_000));
    assert_eq!(r, Ok(Progress::InFlight));
    // This thread now executes the INT3: the handler must drive the patch to
    // completion itself (no one else will) and re-execute the new code.
    assert_eq!(f(), 2);
    assert!(traps_handled() > before);
    assert_eq!(finish_patch(site), Progress::Done);
}

#[test]
fn a_stalled_synccore_patch_is_finished_by_the_thread_that_traps() {
    let _g = exclusive();
    if ensure_sync_core().is_err() {
        eprintln!("membarrier SYNC_CORE unavailable here; skipped");
        return;
    }
    let (_m, f, site) = mov_eax_function(3 * 64 - 4); // 4|1 split
    assert_eq!(start(site, &[0xB8, 3, 0, 0, 0], Wait::SyncCore), Ok(Progress::InFlight));
    // Nobody else drives it: the trapped thread must escalate to barriers.
    assert_eq!(f(), 3);
    assert_eq!(finish_patch(site), Progress::Done);
}

#[test]
fn default_wait_has_a_source() {
    let (w, src) = default_wait();
    match src {
        WaitSource::BuiltIn => {
            assert!(ensure_sync_core().is_ok());
            assert_eq!(w, Wait::SyncCore);
        }
        WaitSource::Unproven => {
            assert!(ensure_sync_core().is_err());
            assert_eq!(w, Wait::Tmax(BUILTIN_TMAX));
        }
        // The other sources are each checked by their effect in
        // tests/settings.rs; here, that the source named is there.
        WaitSource::Env => assert!(
            std::env::var_os("FASTINST_WAIT").is_some() || std::env::var_os("FASTINST_TMAX").is_some(),
            "Env with neither variable set"
        ),
        WaitSource::Config(path) => assert!(path.exists(), "{}", path.display()),
        WaitSource::Explicit => {}
    }
}
