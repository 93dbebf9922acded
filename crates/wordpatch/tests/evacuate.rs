//! `evacuate` on real threads: one spinning strictly inside a run is moved
//! to its end (and so returns, which it otherwise never does), one that
//! blocks every signal is reported, and one sleeping in `poll` is neither
//! signalled nor interrupted. The moved thread's allocations are counted
//! while the handler runs on it: none. Its own test binary: the
//! evacuation's signal handler is process-wide, and its allocator counts.

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use testkit::alloc::{allocations_in, Counting};

#[global_allocator]
static ALLOC: Counting = Counting;

/// `nop; nop; movabs rax, FLAG; 1: cmp byte [rax], 0; je 1b; ret`: spins
/// at bytes 12..17 until the byte at FLAG is set. The run handed to
/// `evacuate` is bytes 0..17, so a thread spinning there is inside it.
const RUN: u64 = 17;

struct Spinner {
    map: memmap2::MmapMut,
    flag: Box<AtomicBool>,
}

impl Spinner {
    fn new() -> Spinner {
        let flag = Box::new(AtomicBool::new(false));
        let mut code = vec![0x90, 0x90, 0x48, 0xb8];
        code.extend_from_slice(&(flag.as_ref() as *const AtomicBool as u64).to_le_bytes());
        code.extend_from_slice(&[0x80, 0x38, 0x00, 0x74, 0xfb, 0xc3]);
        assert_eq!(code.len() as u64, RUN + 1);
        let mut map = memmap2::MmapMut::map_anon(4096).unwrap();
        map[..code.len()].copy_from_slice(&code);
        Spinner { map, flag }
    }

    fn start(&self) -> u64 {
        self.map.as_ptr() as u64
    }

    /// The run a thread spinning here is inside.
    fn run(&self) -> std::ops::Range<u64> {
        self.start()..self.start() + RUN
    }
}

/// Runs the spinner on a new thread (with every signal blocked if `deaf`),
/// returning its tid once it spins, a flag it sets when the code returned,
/// and its handle, which gives the allocations made while it spun.
fn spin(s: &'static Spinner, deaf: bool) -> (i32, Arc<AtomicBool>, std::thread::JoinHandle<u64>) {
    let tid = Arc::new(AtomicI32::new(0));
    let returned = Arc::new(AtomicBool::new(false));
    let (t, r) = (tid.clone(), returned.clone());
    let entry = s.start();
    let h = std::thread::spawn(move || {
        if deaf {
            // SAFETY: a full signal set blocked for this thread alone.
            unsafe {
                let mut all: libc::sigset_t = std::mem::zeroed();
                libc::sigfillset(&mut all);
                libc::pthread_sigmask(libc::SIG_BLOCK, &all, std::ptr::null_mut());
            }
        }
        // SAFETY: gettid cannot fail.
        t.store(unsafe { libc::gettid() }, Ordering::Release);
        // SAFETY: the page holds the complete function above and was made
        // executable before this thread started; it only reads its flag.
        let f: extern "C" fn() = unsafe { std::mem::transmute(entry as usize) };
        let n = allocations_in(|| f());
        r.store(true, Ordering::Release);
        n
    });
    while tid.load(Ordering::Acquire) == 0 {
        std::thread::yield_now();
    }
    // Long enough to be inside the loop.
    std::thread::sleep(Duration::from_millis(50));
    (tid.load(Ordering::Acquire), returned, h)
}

fn executable(s: Spinner) -> &'static Spinner {
    let s = Box::leak(Box::new(s));
    assert_eq!(
        // SAFETY: the anonymous page this spinner owns, made read+execute
        // (leaked: threads run it).
        unsafe { libc::mprotect(s.map.as_mut_ptr().cast(), 4096, libc::PROT_READ | libc::PROT_EXEC) },
        0
    );
    s
}

#[test]
fn threads_inside_a_run_are_moved_out_or_reported_and_sleepers_left_alone() {
    // A sleeper in poll, which a signal would end with EINTR.
    let mut fds = [0i32; 2];
    // SAFETY: a pipe for this test.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    let sleeper = std::thread::spawn(move || {
        let mut p = libc::pollfd {
            fd: fds[0],
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(&mut p, 1, 20_000) };
        (r, std::io::Error::last_os_error())
    });
    std::thread::sleep(Duration::from_millis(50));

    let a = executable(Spinner::new());
    let (tid_a, returned_a, ha) = spin(a, false);
    assert!(!returned_a.load(Ordering::Acquire), "the spinner returned by itself");
    let runs = std::slice::from_ref(&a.run()).to_vec();
    // SAFETY: a test run: a thread inside it may resume at its end (its
    // `ret`), which is what this test wants.
    let e = unsafe { wordpatch::evacuate(&runs, Duration::from_secs(10)) }.unwrap();
    println!("{e:?}");
    assert!(e.is_complete(), "{e:?}");
    assert_eq!(e.moved, 1, "{e:?}");
    assert!(e.signalled >= 1 && e.threads >= 3, "{e:?}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !returned_a.load(Ordering::Acquire) {
        assert!(Instant::now() < deadline, "thread {tid_a} was not moved out of the run");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(ha.join().unwrap(), 0, "allocations while the handler moved the thread");

    let b = executable(Spinner::new());
    let (tid_b, returned_b, hb) = spin(b, true);
    let runs = std::slice::from_ref(&b.run()).to_vec();
    // SAFETY: as above.
    let e = unsafe { wordpatch::evacuate(&runs, Duration::from_millis(300)) }.unwrap();
    println!("{e:?}");
    assert_eq!(
        e.unchecked,
        vec![tid_b],
        "a thread blocking the signal is reported: {e:?}"
    );
    assert_eq!(e.moved, 0, "{e:?}");
    assert!(!returned_b.load(Ordering::Acquire));
    b.flag.store(true, Ordering::Release);
    let _ = hb.join().unwrap();
    assert!(returned_b.load(Ordering::Acquire));
    assert!(wordpatch::threads_moved() >= 1);

    // SAFETY: the pipe's write end.
    assert_eq!(unsafe { libc::write(fds[1], b"x".as_ptr().cast(), 1) }, 1);
    let (r, err) = sleeper.join().unwrap();
    assert_eq!(r, 1, "the sleeper's poll was interrupted: {err}");
}
