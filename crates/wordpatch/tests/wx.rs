//! W^X (`WriteMode::Alias`): code is patched while no page of the process is
//! both writable and executable, a fork child gets code of its own, and
//! forgotten code leaves no alias behind. Every test here sets alias mode:
//! this binary is a process of its own.

use std::sync::Mutex;
use wordpatch::{patch, set_write_mode, WriteMode, PAGE_SIZE};

/// Tests here fork; one at a time, so no test's threads are copied into
/// another's child mid-patch.
static SERIAL: Mutex<()> = Mutex::new(());

/// A page of code `mov eax, imm32; ret` at a straddling site and at an
/// in-line one, made read+execute: returns the page and the two functions.
fn code_page() -> (usize, usize, usize) {
    // SAFETY: a fresh anonymous mapping of ours.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            PAGE_SIZE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    } as usize;
    assert_ne!(p, libc::MAP_FAILED as usize);
    let put = |at: usize, imm: u32| {
        let mut b = vec![0xB8];
        b.extend_from_slice(&imm.to_le_bytes());
        b.push(0xC3);
        // SAFETY: our own writable page, not yet executable.
        unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), at as *mut u8, b.len()) };
    };
    // SAFETY: as above.
    unsafe { std::ptr::write_bytes(p as *mut u8, 0xCC, PAGE_SIZE) };
    let straddling = p + 64 - 2; // `mov` split 2|3 across a line
    let in_line = p + 256;
    put(straddling, 1);
    put(in_line, 2);
    // SAFETY: our own page becomes read+execute.
    let rc = unsafe { libc::mprotect(p as *mut _, PAGE_SIZE, libc::PROT_READ | libc::PROT_EXEC) };
    assert_eq!(rc, 0);
    (p, straddling, in_line)
}

/// Waits for child `pid` (at most 20 s: a child stuck on a patch its
/// parent left in flight would hang the test) and says whether it exited 0.
fn child_ok(pid: libc::pid_t) -> bool {
    let start = std::time::Instant::now();
    let mut status = 0;
    loop {
        // SAFETY: our own child; WNOHANG does not block.
        match unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } {
            0 if start.elapsed() < std::time::Duration::from_secs(20) => {
                std::thread::sleep(std::time::Duration::from_millis(1))
            }
            0 => {
                // SAFETY: our own child, stuck.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                // SAFETY: reaps it.
                unsafe { libc::waitpid(pid, &mut status, 0) };
                eprintln!("child {pid} hung");
                return false;
            }
            _ => return libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        }
    }
}

fn call(at: usize) -> u32 {
    // SAFETY: `at` starts `mov eax, imm32; ret` in an executable page.
    let f: extern "C" fn() -> u32 = unsafe { std::mem::transmute(at) };
    f()
}

fn set(at: usize, imm: u32) {
    let mut b = [0xB8u8, 0, 0, 0, 0];
    b[1..].copy_from_slice(&imm.to_le_bytes());
    // SAFETY: `at` starts a 5-byte `mov` of our code page; any immediate is
    // valid code.
    unsafe { patch(at as *mut u8, &b) }.unwrap();
}

/// The mappings of this process that are both writable and executable,
/// and the line of the mapping holding `addr`.
fn maps_of(addr: usize) -> (Vec<String>, String) {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let wx = maps
        .lines()
        .filter(|l| {
            l.split_whitespace()
                .nth(1)
                .is_some_and(|p| p.contains('w') && p.contains('x'))
        })
        .map(str::to_string)
        .collect();
    let line = maps
        .lines()
        .find(|l| {
            let (a, b) = l.split_whitespace().next().unwrap().split_once('-').unwrap();
            (usize::from_str_radix(a, 16).unwrap()..usize::from_str_radix(b, 16).unwrap()).contains(&addr)
        })
        .unwrap()
        .to_string();
    (wx, line)
}

#[test]
fn code_is_patched_with_no_page_writable_and_executable() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    set_write_mode(WriteMode::Alias);
    let (page, s, l) = code_page();
    for round in 0..200u32 {
        set(s, 10 + round);
        set(l, 20 + round);
        assert_eq!((call(s), call(l)), (10 + round, 20 + round));
    }
    let (wx, line) = maps_of(page);
    assert!(wx.is_empty(), "writable and executable: {wx:?}");
    assert!(
        line.contains(" r-xs ") && line.contains("/memfd:fastinst-code:0:"),
        "{line}"
    );
    assert!(wordpatch::aliased_bytes() >= PAGE_SIZE);
    wordpatch::forget_pages(page as *const u8, PAGE_SIZE);
    // SAFETY: our own page, forgotten above.
    unsafe { libc::munmap(page as *mut _, PAGE_SIZE) };
}

#[test]
fn a_forgotten_page_loses_its_alias_and_new_code_there_is_aliased_afresh() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    set_write_mode(WriteMode::Alias);
    let (page, s, _) = code_page();
    set(s, 7);
    let before = wordpatch::aliased_bytes();
    wordpatch::forget_pages(page as *const u8, PAGE_SIZE);
    assert_eq!(wordpatch::aliased_bytes(), before - PAGE_SIZE);
    // SAFETY: our own page, forgotten above.
    unsafe { libc::munmap(page as *mut _, PAGE_SIZE) };
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    assert_eq!(
        maps.matches("/memfd:fastinst-code:0:").count(),
        2 * (before - PAGE_SIZE) / PAGE_SIZE,
        "the forgotten page's alias is unmapped:\n{maps}"
    );
    let (page2, s2, _) = code_page();
    set(s2, 8);
    assert_eq!(call(s2), 8);
    wordpatch::forget_pages(page2 as *const u8, PAGE_SIZE);
    // SAFETY: as above.
    unsafe { libc::munmap(page2 as *mut _, PAGE_SIZE) };
}

#[test]
fn a_fork_child_gets_code_of_its_own() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    set_write_mode(WriteMode::Alias);
    let (page, s, l) = code_page();
    set(s, 100);
    set(l, 200);
    // A pipe: the child says when it has patched, the parent when it has.
    let mut to_parent = [0; 2];
    let mut to_child = [0; 2];
    // SAFETY: fresh descriptors into the arrays.
    assert_eq!(unsafe { libc::pipe(to_parent.as_mut_ptr()) }, 0);
    // SAFETY: as above.
    assert_eq!(unsafe { libc::pipe(to_child.as_mut_ptr()) }, 0);
    // SAFETY: the child runs only the code below (patch, call, write, read,
    // _exit), then exits without unwinding.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        // SAFETY: the ends this side does not use: the child sees end of
        // file if the parent goes away.
        unsafe { (libc::close(to_parent[0]), libc::close(to_child[1])) };
        let ok = call(s) == 100 && call(l) == 200;
        set(s, 101);
        set(l, 201);
        let mut b = [0u8];
        // SAFETY: our pipe ends.
        unsafe { libc::write(to_parent[1], b"x".as_ptr().cast(), 1) };
        // SAFETY: as above; waits for the parent's patches.
        unsafe { libc::read(to_child[0], b.as_mut_ptr().cast(), 1) };
        // The parent patched its copy meanwhile: ours is unchanged.
        let ok = ok && call(s) == 101 && call(l) == 201;
        let (wx, _) = maps_of(page);
        // SAFETY: leaves the child without running the test harness's code.
        unsafe { libc::_exit(if ok && wx.is_empty() { 0 } else { 1 }) };
    }
    // SAFETY: the ends the child uses.
    unsafe { (libc::close(to_parent[1]), libc::close(to_child[0])) };
    let mut b = [0u8];
    // SAFETY: our pipe ends.
    unsafe { libc::read(to_parent[0], b.as_mut_ptr().cast(), 1) };
    assert_eq!((call(s), call(l)), (100, 200), "the child's patches reached the parent");
    set(s, 300);
    set(l, 400);
    // SAFETY: as above.
    unsafe { libc::write(to_child[1], b"x".as_ptr().cast(), 1) };
    assert!(child_ok(pid), "the child saw the parent's patches or failed");
    assert_eq!((call(s), call(l)), (300, 400));
    assert_eq!(wordpatch::forks_with_late_child(), 0);
    wordpatch::forget_pages(page as *const u8, PAGE_SIZE);
    // SAFETY: our own page, forgotten above.
    unsafe { libc::munmap(page as *mut _, PAGE_SIZE) };
}

#[test]
fn forks_while_another_thread_patches_give_each_child_consistent_code() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    set_write_mode(WriteMode::Alias);
    let (page, s, l) = code_page();
    set(s, 1);
    set(l, 1);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let st = stop.clone();
    // The straddling site and the in-line one, toggled between 1 and 2 and
    // run after each toggle: a child's patch reaching the parent's code
    // would show here as a value this thread did not write.
    let patcher = std::thread::spawn(move || {
        let (mut n, mut wrong) = (0u64, 0u64);
        while !st.load(std::sync::atomic::Ordering::Relaxed) {
            let v = 1 + (n % 2) as u32;
            set(s, v);
            set(l, v);
            wrong += u64::from(call(s) != v) + u64::from(call(l) != v);
            n += 1;
        }
        (n, wrong)
    });
    let forks = 100;
    for _ in 0..forks {
        // SAFETY: the child runs only calls, patches and `_exit`; the
        // patcher thread does not exist in it.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            // The parent's patch in flight at the fork, if any, was
            // finished or dropped: both sites hold a whole value.
            let seen = [call(s), call(l)];
            let mut ok = seen.iter().all(|v| (1..=2).contains(v));
            // The child's own patches, straddling ones included.
            for v in [7, 8, 9] {
                set(s, v);
                set(l, v);
                ok &= call(s) == v && call(l) == v;
            }
            // SAFETY: ends the child without running the harness's code.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        assert!(
            child_ok(pid),
            "a child found a patch half done, or its own patches failed"
        );
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (toggles, wrong) = patcher.join().unwrap();
    eprintln!("{forks} forks while the patcher made {toggles} patches, {wrong} read back wrong");
    assert!(toggles > 0);
    assert_eq!(wrong, 0, "a child's patches reached the parent's code");
    assert_eq!(wordpatch::forks_with_late_child(), 0);
    wordpatch::forget_pages(page as *const u8, PAGE_SIZE);
    // SAFETY: our own page, forgotten above.
    unsafe { libc::munmap(page as *mut _, PAGE_SIZE) };
}
