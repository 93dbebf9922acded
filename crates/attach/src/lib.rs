//! Attaching fastinst to a running process, and detaching it so that the
//! process runs on as it was: what `fastinst attach PID` does.
//!
//! An attach, in order:
//! 1. Checks that leave the process untouched: it exists, it is the
//!    caller's (or the caller is root), no tracer holds it, the runtime is
//!    neither preloaded nor attached in it now (one attached before and
//!    detached is started again), and its modules' ELF files list sled
//!    sites (`-fpatchable-function-entry`).
//! 2. Every thread is stopped with ptrace ([`threads::Stopped::all`]).
//!    gcc's sleds are five 1-byte NOPs, and a thread may be stopped between
//!    two of them: any such thread is single-stepped out, then the sleds
//!    are rewritten to one 5-byte instruction through `/proc/PID/mem`. This
//!    is the only time all threads are stopped.
//! 3. All threads but one go on. That one, chosen stopped in a system call
//!    other than a memory-mapping one, or outside the C library and the
//!    loader (so it holds neither the loader's lock nor `malloc`'s), calls
//!    `dlopen` on `libfastinst.so` and then `fastinst_attach_start` with
//!    a settings file ([`remote::call`]); its registers and stack are put
//!    back and it goes on.
//!
//! A detach ([`Session::detach`]) asks the runtime over its control socket
//! to stop (reports written, every probe off, sampler ended), stops every
//! thread again until none is inside the library, writes every sled's
//! bytes back from the ELF file and checks them all, and lets go.
//!
//! What stays in the process: the mapped library (it cannot be unloaded
//! while a call being timed may still return through it), its trampoline
//! pages and its idle state. A later attach finds the library loaded and
//! starts the runtime in it again ([`attach`]).

pub mod bindings;
pub mod code;
pub mod error;
pub mod files;
pub mod headers;
pub mod maps;
pub mod mem;
pub mod remote;
pub mod sleds;
pub mod symbols;
pub mod threads;

pub use error::{AttachError, Result};
use mem::Mem;
use nix::sys::ptrace;
use nix::unistd::Pid;
use sleds::Site;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use threads::Stopped;

/// The file name of the runtime library.
pub const LIBRARY_NAME: &str = "libfastinst.so";

/// How long a call made in the process may take.
const CALL_LIMIT: Duration = Duration::from_secs(10);

/// What an attach is given.
#[derive(Clone, Debug)]
pub struct Options {
    /// The runtime library to load (absolute).
    pub library: PathBuf,
    /// `FASTINST_*` settings for the runtime.
    pub settings: Vec<(String, String)>,
}

/// What an attach measured.
#[derive(Clone, Debug, Default)]
pub struct Timings {
    /// Threads stopped.
    pub threads: usize,
    /// Sled sites found, and of them rewritten to one instruction.
    pub sites: usize,
    /// See [`Timings::sites`].
    pub normalised: usize,
    /// `-finstrument-functions` hook slots bound to the runtime.
    pub slots: usize,
    /// The process was found attached by a command that had been killed,
    /// and was detached first.
    pub recovered: bool,
    /// From the first thread stopped to all going on again.
    pub all_stopped: Duration,
    /// Before any thread stopped: the maps, the modules' sled tables and
    /// hook slots read, and their code checked against the files.
    pub prepared: Duration,
    /// The remote `dlopen` of the runtime's library.
    pub loaded: Duration,
    /// The remote call that starts the runtime, until its probes are armed.
    pub started: Duration,
    /// The whole attach, until the runtime had started.
    pub total: Duration,
}

/// A process with the runtime attached.
#[derive(Debug)]
pub struct Session {
    pid: i32,
    sites: Vec<Site>,
    /// The modules mapped at the attach: one mapped since is a library
    /// loaded while attached, which the runtime probed.
    modules: Vec<maps::Module>,
    /// Hook slots bound to the runtime, with what each held.
    bound: Vec<(bindings::Slot, u64)>,
    /// The probed modules' code, and what of it differed from the files
    /// before the attach.
    regions: Vec<code::Region>,
    code_before: Vec<code::Run>,
    /// The attach's lock ([`take_lock`]), held until the session ends.
    _lock: Option<std::fs::File>,
    control: PathBuf,
    library: PathBuf,
    /// What the attach measured.
    pub timings: Timings,
}

/// What a detach did.
#[derive(Clone, Debug, Default)]
pub struct Detached {
    /// The report files the runtime wrote.
    pub files: Vec<PathBuf>,
    /// Sites checked equal to their files' bytes.
    pub sites_checked: usize,
    /// Of them, the sites of libraries loaded while attached.
    pub late_sites: usize,
    /// Hook slots put back.
    pub slots_restored: usize,
    /// Of them, the slots of libraries loaded while attached.
    pub late_slots: usize,
    /// Runs of code bytes put back from the files (sleds aside).
    pub code_restored: usize,
    /// Code bytes compared with the files.
    pub code_checked: u64,
    /// Times all threads were stopped before none was inside the library.
    pub tries: usize,
    /// From the request to letting go of the threads, the code put back:
    /// the program runs as before from here, while the reports are written.
    pub released: Duration,
    /// From the request to the reports written and the runtime's last
    /// thread gone.
    pub total: Duration,
    /// Of it, all threads stopped (the last try).
    pub all_stopped: Duration,
}

/// The process's owner (real uid) and tracer, from `/proc/PID/status`.
fn owner_and_tracer(pid: i32) -> Result<(u32, i32)> {
    let path = format!("/proc/{pid}/status");
    let text = std::fs::read_to_string(&path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => AttachError::NoProcess(pid),
        _ => AttachError::io(path)(e),
    })?;
    let field = |k: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(k))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<i64>().ok())
    };
    let uid = field("Uid:").ok_or_else(|| AttachError::Other(format!("no Uid in /proc/{pid}/status")))?;
    Ok((uid as u32, field("TracerPid:").unwrap_or(0) as i32))
}

/// The address of `symbol` in process memory, for the module whose path
/// ends with `file_suffix`.
fn symbol_in(maps: &[maps::Mapping], file_suffix: &str, symbol: &str) -> Result<u64> {
    symbols_in(maps, file_suffix, &[symbol]).map(|v| v[0])
}

/// [`symbol_in`] for several symbols of one module, its file read once
/// ([`symbols::dynamic`]: its dynamic symbols only).
fn symbols_in(maps: &[maps::Mapping], file_suffix: &str, names: &[&str]) -> Result<Vec<u64>> {
    let modules = maps::modules(maps);
    let missing = |symbol: &str, module: &str| AttachError::NoSymbol {
        symbol: symbol.into(),
        module: module.into(),
    };
    let m = modules
        .iter()
        .find(|m| m.path.file_name().is_some_and(|n| n.to_string_lossy() == file_suffix))
        .ok_or_else(|| missing(names.first().copied().unwrap_or(""), file_suffix))?;
    let found = symbols::dynamic(&m.path, m.base, names)?;
    names
        .iter()
        .zip(found)
        .map(|(name, at)| at.ok_or_else(|| missing(name, &m.path.display().to_string())))
        .collect()
}

/// The settings file and control socket paths for `pid` of user `uid`
/// (the runtime's `fastinst::attach::config_path` names the same file),
/// the directory made (mode 0700, owned by `uid`) if needed.
fn paths(uid: u32, pid: i32) -> Result<(PathBuf, PathBuf)> {
    let dir = PathBuf::from(format!("/tmp/fastinst-{uid}"));
    let what = dir.display().to_string();
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(AttachError::io(what.clone()))?;
        std::os::unix::fs::chown(&dir, Some(uid), None).map_err(AttachError::io(what.clone()))?;
    }
    // Another user's directory there could read the settings or stand a
    // socket of its own in: only the owner's, closed to others, is used.
    let meta = std::fs::symlink_metadata(&dir).map_err(AttachError::io(what.clone()))?;
    if !meta.is_dir() || meta.uid() != uid || meta.mode() & 0o077 != 0 {
        return Err(AttachError::Other(format!(
            "{what} is not a directory of user {uid} closed to others (mode 0700); remove it and try again"
        )));
    }
    Ok((dir.join(format!("attach-{pid}.conf")), dir.join(format!("{pid}.sock"))))
}

/// How good a thread stopped with these registers is to borrow, best
/// first, or `None` when it may not be ([`safe_to_borrow`]): one running
/// its own code leaves no system call to restart; then one whose system
/// call restarts from its registers; last one whose call restarts from
/// the kernel's per-thread record (`nanosleep`, `poll`, a timed futex
/// wait: `-ERESTART_RESTARTBLOCK`), which the call must not disturb.
fn borrow_rank(regs: &libc::user_regs_struct, maps: &[maps::Mapping]) -> Option<u8> {
    const ERESTART_RESTARTBLOCK: i64 = -516;
    if !safe_to_borrow(regs, maps) {
        return None;
    }
    Some(match (regs.orig_rax as i64, regs.rax as i64) {
        (nr, _) if nr < 0 => 0,
        (_, ERESTART_RESTARTBLOCK) => 2,
        _ => 1,
    })
}

/// Whether a thread stopped with these registers may run `dlopen` without
/// waiting on a lock it holds itself: in a system call that is not a
/// memory-mapping one (`malloc` makes those holding its lock), or outside
/// the C library and the loader.
fn safe_to_borrow(regs: &libc::user_regs_struct, maps: &[maps::Mapping]) -> bool {
    const MM: [u64; 6] = [9, 10, 11, 12, 25, 28]; // mmap mprotect munmap brk mremap madvise
    if (regs.orig_rax as i64) >= 0 {
        return !MM.contains(&regs.orig_rax);
    }
    !maps.iter().any(|m| {
        m.contains(regs.rip)
            && (m.path.contains("/libc.so") || m.path.contains("/ld-linux") || m.path.contains("/libc-"))
    })
}

/// Attaches the runtime to process `pid`.
pub fn attach(pid: i32, opts: &Options) -> Result<Session> {
    let began = Instant::now();
    if opts.library.file_name().is_none_or(|n| n != LIBRARY_NAME) {
        return Err(AttachError::LibraryName(opts.library.clone()));
    }
    let (owner, tracer) = owner_and_tracer(pid)?;
    // SAFETY: getuid cannot fail.
    let me = unsafe { libc::getuid() };
    if me != 0 && me != owner {
        return Err(AttachError::NotOwner { pid, owner, me });
    }
    if tracer != 0 {
        return Err(AttachError::Traced { pid, tracer });
    }
    let lock = take_lock(owner, pid)?.ok_or(AttachError::AlreadyAttached(pid))?;
    let mut maps = maps::of(pid)?;
    let mut recovered = false;
    if control_socket(pid).is_some_and(|s| control(&s, "status").is_ok_and(|a| a.starts_with("ok attached"))) {
        // Attached, and the command that attached it is gone (killed):
        // detached first, on its behalf.
        recover(pid, owner, &maps)?;
        maps = maps::of(pid)?;
        recovered = true;
    }
    let library = loaded_library(pid, &maps)?.unwrap_or_else(|| opts.library.clone());
    let modules = maps::modules(&maps);
    let mut files = files::Files::new();
    let sites = sleds::of_modules(&modules, &mut files)?;
    let slots = bindings::of_modules(&modules, &mut files)?;
    if sites.is_empty() && slots.is_empty() {
        return Err(AttachError::NoSites(pid));
    }
    // The code the runtime may change: the probed modules'. What differs
    // from the files already is not the runtime's to put back.
    let regions = code::regions(&maps, &probed(&maps, &modules, &sites, &slots), &mut files);
    let code_before = code::differing(&Mem::open(pid)?, &regions)?;
    let loader = symbols_in(&maps, "libc.so.6", &["dlopen", "dlerror"])?;
    let (dlopen, dlerror) = (loader[0], loader[1]);
    let (config, control) = paths(owner, pid)?;
    let mut text = String::from("# written by fastinst attach\n");
    for (k, v) in &opts.settings {
        text.push_str(&format!("{k}={v}\n"));
    }
    text.push_str(&format!("FASTINST_CONTROL={}\n", control.display()));
    std::fs::write(&config, text).map_err(AttachError::io(config.display().to_string()))?;
    let _ = std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o600));
    let _ = std::os::unix::fs::chown(&config, Some(owner), None);
    let plan = Plan {
        maps: &maps,
        sites: &sites,
        dlopen,
        dlerror,
        config: &config,
    };
    let r = attach_stopped(pid, &library, &plan, began);
    let _ = std::fs::remove_file(&config);
    let mut timings = r?;
    let mut session = Session {
        pid,
        sites,
        modules,
        bound: Vec::new(),
        regions,
        code_before,
        control,
        library,
        timings: Timings::default(),
        _lock: Some(lock),
    };
    if !slots.is_empty() {
        match bind_hooks(pid, &slots) {
            Ok(bound) => session.bound = bound,
            Err(e) => {
                // The runtime runs with its sleds alone; undone all the same.
                let _ = session.detach();
                return Err(e);
            }
        }
    }
    timings.slots = session.bound.len();
    timings.recovered = recovered;
    timings.total = began.elapsed();
    session.timings = timings;
    Ok(session)
}

/// The modules the runtime may change the code of: those with sleds or
/// hook slots.
fn probed(
    maps: &[maps::Mapping],
    modules: &[maps::Module],
    sites: &[Site],
    slots: &[bindings::Slot],
) -> Vec<maps::Module> {
    modules
        .iter()
        .filter(|m| {
            let of_m = |a: u64| {
                maps.iter()
                    .any(|x| x.path.as_str() == m.path.as_os_str() && x.contains(a))
            };
            sites.iter().any(|s| of_m(s.addr)) || slots.iter().any(|s| of_m(s.addr))
        })
        .cloned()
        .collect()
}

/// Takes `/tmp/fastinst-<uid>/<pid>.lock` exclusively (`flock`): the mark
/// of the command attached to the process, held as long as its session
/// is. The kernel lets go of it when that command ends, however it ends,
/// so a runtime attached with the lock free was left by a command that
/// was killed. `None`: another command holds it.
fn take_lock(uid: u32, pid: i32) -> Result<Option<std::fs::File>> {
    let (config, _) = paths(uid, pid)?;
    let path = config.with_file_name(format!("{pid}.lock"));
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(&path)
        .map_err(AttachError::io(path.display().to_string()))?;
    // SAFETY: flock on a descriptor this function owns.
    if unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&file), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Ok(None);
    }
    Ok(Some(file))
}

/// Detaches a runtime whose attaching command was killed: what that
/// command knew is found again (the sleds and hook slots from the files,
/// the slots' old values from the C library). Everything in the probed
/// modules' code that differs from the files is taken for the runtime's
/// and put back.
fn recover(pid: i32, owner: u32, maps: &[maps::Mapping]) -> Result<()> {
    let modules = maps::modules(maps);
    let found = Found::of(maps, &modules)?;
    let library = maps
        .iter()
        .find(|m| m.path.ends_with(LIBRARY_NAME))
        .map(|m| PathBuf::from(&m.path))
        .ok_or(AttachError::Other(format!(
            "process {pid}: attached, with no {LIBRARY_NAME} mapped"
        )))?;
    let (_, control) = paths(owner, pid)?;
    let session = Session {
        pid,
        regions: found.regions,
        sites: found.sites,
        modules,
        bound: found.bound,
        code_before: Vec::new(),
        control,
        library,
        timings: Timings::default(),
        _lock: None,
    };
    session.detach().map(drop)
}

/// Points every hook slot at the runtime's hook of its name, with every
/// thread stopped (a slot is read by calls on any thread); returns each
/// slot with what it held.
fn bind_hooks(pid: i32, slots: &[bindings::Slot]) -> Result<Vec<(bindings::Slot, u64)>> {
    let maps = maps::of(pid)?;
    let hooks = symbols_in(&maps, LIBRARY_NAME, &bindings::HOOKS)?;
    let mem = Mem::open(pid)?;
    let _all = Stopped::all(pid)?;
    let mut bound = Vec::with_capacity(slots.len());
    for s in slots {
        let mut was = [0u8; 8];
        mem.read(s.addr, &mut was)?;
        mem.write(s.addr, &hooks[s.hook].to_le_bytes())?;
        bound.push((s.clone(), u64::from_le_bytes(was)));
    }
    Ok(bound)
}

/// The runtime library the process has loaded already, if any: one that
/// was attached and detached, to be started again (loading it again
/// returns the same library). Refused: a preloaded runtime and a library
/// whose file was replaced (loading the path again would bring in a
/// second runtime). One attached now was refused or detached before
/// ([`attach`]'s lock).
fn loaded_library(pid: i32, maps: &[maps::Mapping]) -> Result<Option<PathBuf>> {
    if maps
        .iter()
        .any(|m| m.path.contains(&format!("{LIBRARY_NAME} (deleted)")))
    {
        return Err(AttachError::StaleLibrary(pid));
    }
    let Some(m) = maps.iter().find(|m| m.path.ends_with(LIBRARY_NAME)) else {
        return Ok(None);
    };
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    let preloaded = environ
        .split(|&b| b == 0)
        .filter_map(|v| v.strip_prefix(b"LD_PRELOAD="))
        .any(|v| String::from_utf8_lossy(v).contains(LIBRARY_NAME));
    if preloaded {
        return Err(AttachError::AlreadyLoaded(pid));
    }
    Ok(Some(PathBuf::from(&m.path)))
}

/// What the checks found, for the part of the attach that stops threads.
struct Plan<'a> {
    maps: &'a [maps::Mapping],
    sites: &'a [Site],
    /// `dlopen` and `dlerror` in the process.
    dlopen: u64,
    dlerror: u64,
    /// The settings file.
    config: &'a Path,
}

fn attach_stopped(pid: i32, library: &Path, plan: &Plan, began: Instant) -> Result<Timings> {
    let Plan {
        maps,
        sites,
        dlopen,
        dlerror,
        config,
    } = *plan;
    let mem = Mem::open(pid)?;
    let mut timings = Timings {
        sites: sites.len(),
        ..Timings::default()
    };
    timings.prepared = began.elapsed();
    let mut tries = 0;
    let (held, stopped_for) = loop {
        let t0 = Instant::now();
        let mut all = Stopped::all(pid)?;
        timings.threads = all.threads.len();
        let borrow = all
            .threads
            .iter()
            .filter_map(|h| Some((borrow_rank(&ptrace::getregs(h.tid).ok()?, maps)?, h.tid)))
            .min()
            .map(|(_, tid)| tid);
        let Some(borrow) = borrow else {
            all.release();
            tries += 1;
            if tries > 500 {
                return Err(AttachError::Other(format!(
                    "process {pid}: every thread stayed inside the C library's allocator or loader for 1 s"
                )));
            }
            std::thread::sleep(Duration::from_millis(2));
            continue;
        };
        for (tid, pc) in all.pcs() {
            if let Some(s) = sites
                .iter()
                .find(|s| pc > s.addr && pc < s.addr + providers::patchable::SLED_LEN as u64 && s.needs_normalising())
            {
                all.step_out(tid, s.addr, s.addr + providers::patchable::SLED_LEN as u64)?;
            }
        }
        let normalise: Vec<_> = sites
            .iter()
            .filter(|s| s.needs_normalising())
            .map(|s| (s.addr, providers::patchable::NORMALISED))
            .collect();
        sleds::write_all(&mem, &normalise)?;
        timings.normalised = normalise.len();
        let held = all.release_except(borrow);
        break (held, t0.elapsed());
    };
    timings.all_stopped = stopped_for;
    let tid = held.tid;
    let result = load_and_start(&mem, pid, tid, library, dlopen, dlerror, config, &mut timings);
    let _ = ptrace::detach(tid, held.pending);
    if let Err(e) = result {
        // Leave the process as it was: the sleds' bytes back.
        if let Ok(mut all) = Stopped::all(pid) {
            let back: Vec<_> = sites
                .iter()
                .filter(|s| s.needs_normalising())
                .map(|s| (s.addr, s.original))
                .collect();
            let _ = sleds::write_all(&mem, &back);
            all.release();
        }
        return Err(e);
    }
    timings.total = began.elapsed();
    Ok(timings)
}

#[allow(clippy::too_many_arguments)]
fn load_and_start(
    mem: &Mem,
    pid: i32,
    tid: Pid,
    library: &Path,
    dlopen: u64,
    dlerror: u64,
    config: &Path,
    timings: &mut Timings,
) -> Result<()> {
    let t0 = Instant::now();
    let lib = library.to_string_lossy().into_owned();
    let mut path = lib.clone().into_bytes();
    path.push(0);
    let handle = remote::call(
        mem,
        tid,
        dlopen,
        &[remote::DATA, libc::RTLD_NOW as u64],
        &path,
        "dlopen",
        CALL_LIMIT,
    )?;
    if handle == 0 {
        let msg = remote::call(mem, tid, dlerror, &[], &[], "dlerror", CALL_LIMIT)?;
        let message = if msg == 0 {
            "unknown error".to_string()
        } else {
            mem.c_string(msg)?
        };
        return Err(AttachError::Dlopen { library: lib, message });
    }
    timings.loaded = t0.elapsed();
    let t0 = Instant::now();
    let maps = maps::of(pid)?;
    let start = symbol_in(&maps, LIBRARY_NAME, "fastinst_attach_start")?;
    let mut cfg = config.to_string_lossy().into_owned().into_bytes();
    cfg.push(0);
    let code = remote::call(
        mem,
        tid,
        start,
        &[remote::DATA],
        &cfg,
        "fastinst_attach_start",
        CALL_LIMIT,
    )? as i32;
    if code != 0 {
        let reason = match code {
            1 => "the settings file could not be read",
            2 => "the runtime was started in this process already",
            3 => "the control socket could not be made",
            4 => "the settings name no control socket",
            5 => "the tool could not start (the trace tool runs once in a process)",
            _ => "a panic or a bad argument",
        };
        return Err(AttachError::Start { pid, code, reason });
    }
    timings.started = t0.elapsed();
    Ok(())
}

/// The control socket an attached runtime in process `pid` serves (named
/// by the process's owner and id, as [`attach`] makes it), if it is there.
pub fn control_socket(pid: i32) -> Option<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let uid = std::fs::metadata(format!("/proc/{pid}")).ok()?.uid();
    let p = PathBuf::from(format!("/tmp/fastinst-{uid}/{pid}.sock"));
    p.exists().then_some(p)
}

/// Sends one command line to the runtime's control socket at `path` and
/// returns its one-line answer.
pub fn control(path: &Path, command: &str) -> Result<String> {
    let what = format!("control socket {}", path.display());
    let mut s = UnixStream::connect(path).map_err(AttachError::io(what.clone()))?;
    s.set_read_timeout(Some(Duration::from_secs(60)))
        .map_err(AttachError::io(what.clone()))?;
    writeln!(s, "{command}").map_err(AttachError::io(what.clone()))?;
    // Every line until the runtime closes the connection (`detach`
    // answers twice).
    let mut text = String::new();
    std::io::Read::read_to_string(&mut BufReader::new(&s), &mut text).map_err(AttachError::io(what))?;
    Ok(text.trim_end().to_string())
}

impl Session {
    /// The process.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// The runtime's control socket.
    pub fn control_path(&self) -> &Path {
        &self.control
    }

    /// Sends a command to the runtime ([`control`]).
    pub fn command(&self, command: &str) -> Result<String> {
        control(&self.control, command)
    }

    /// What the runtime may have changed in the modules mapped since the
    /// attach (libraries the process loaded while attached, which it
    /// probed): their sleds and hook slots, read from their files, and
    /// their code. The runtime's own library is not one of them.
    fn late(&self) -> Result<Found> {
        let maps = maps::of(self.pid)?;
        let modules: Vec<maps::Module> = maps::modules(&maps)
            .into_iter()
            .filter(|m| !self.modules.contains(m) && m.path != self.library && !m.path.ends_with(LIBRARY_NAME))
            .collect();
        Found::of(&maps, &modules)
    }

    /// Detaches: the runtime stops and writes its reports, then every sled
    /// gets its file's bytes back, with no thread inside the library.
    pub fn detach(self) -> Result<Detached> {
        let began = Instant::now();
        let what = format!("control socket {}", self.control.display());
        let conn = UnixStream::connect(&self.control).map_err(AttachError::io(what.clone()))?;
        conn.set_read_timeout(Some(Duration::from_secs(60)))
            .map_err(AttachError::io(what.clone()))?;
        writeln!(&conn, "detach").map_err(AttachError::io(what.clone()))?;
        let mut answers = BufReader::new(&conn);
        let mut line = String::new();
        answers.read_line(&mut line).map_err(AttachError::io(what.clone()))?;
        // The runtime's thread that goes on to write the reports: inside
        // the library while the code is put back, and allowed to be.
        let writer: i32 = match line.trim().strip_prefix("ok off ").and_then(|t| t.parse().ok()) {
            Some(tid) => tid,
            None => {
                return Err(AttachError::Other(format!(
                    "the runtime did not detach: {}",
                    line.trim()
                )))
            }
        };
        // The runtime's sled watcher ended before it answered: the
        // libraries loaded while attached are all mapped now, and read
        // before any thread stops.
        let late = self.late()?;
        let (late_sites, late_slots) = (late.sites.len(), late.bound.len());
        let (mut sites, mut bound, mut regions) = (self.sites, self.bound, self.regions);
        sites.extend(late.sites);
        bound.extend(late.bound);
        regions.extend(late.regions);
        let mem = Mem::open(self.pid)?;
        let mut tries = 0;
        loop {
            tries += 1;
            let t0 = Instant::now();
            let mut all = Stopped::all(self.pid)?;
            let maps = maps::of(self.pid)?;
            let lib: Vec<&maps::Mapping> = maps
                .iter()
                .filter(|m| m.exec() && (Path::new(&m.path) == self.library || m.path.ends_with(LIBRARY_NAME)))
                .collect();
            let inside = all
                .pcs()
                .iter()
                .any(|(tid, pc)| tid.as_raw() != writer && lib.iter().any(|m| m.contains(*pc)));
            if inside && tries < 1000 {
                all.release();
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
            // The hook slots first: from here no call reaches a hook.
            for (slot, was) in bound.iter() {
                mem.write(slot.addr, &was.to_le_bytes())?;
            }
            // Every site: the runtime's off bytes are a 5-byte NOP of its
            // own, and clang's differ from it. Both forms are one
            // instruction, so no stopped thread can be inside either.
            let back: Vec<_> = sleds::differing(&mem, &sites)?
                .into_iter()
                .map(|(site, _)| (site.addr, site.original))
                .collect();
            sleds::write_all(&mem, &back)?;
            // Then every other byte of code the runtime changed (hook
            // calls switched off, rewritten argument loads): a thread
            // stopped inside such a run, between two instructions the
            // runtime wrote, is stepped out of it first.
            let mut runs = code::new_since(&self.code_before, code::differing(&mem, &regions)?);
            runs.sort_by_key(|r| r.addr);
            // Each thread's place read once, not once a run (thousands of
            // runs in a `-finstrument-functions` build, each read a
            // system call a thread while all stand stopped).
            for (tid, mut pc) in all.pcs() {
                for _ in 0..4 {
                    let Some(r) = code::strictly_inside(&runs, pc) else {
                        break;
                    };
                    pc = all.step_out(tid, r.addr, r.addr + r.file.len() as u64)?;
                }
            }
            code::write_back(&mem, &runs)?;
            all.release();
            let all_stopped = t0.elapsed();
            // Checked with the threads running: nothing writes this code
            // any more (the runtime's probes are off and its sampler has
            // ended, and no call reaches its hooks), so what is read now
            // is what the threads run from here on.
            let wrong = sleds::differing(&mem, &sites)?;
            let wrong_code = code::new_since(&self.code_before, code::differing(&mem, &regions)?);
            let mut wrong_slots = 0;
            for (slot, was) in bound.iter() {
                let mut now = [0u8; 8];
                mem.read(slot.addr, &mut now)?;
                wrong_slots += usize::from(u64::from_le_bytes(now) != *was);
            }
            if let Some((site, found)) = wrong.first() {
                return Err(AttachError::Other(format!(
                    "{} sites differ from their files after the detach, the first at {:#x}: {found:02x?}",
                    wrong.len(),
                    site.addr
                )));
            }
            if let Some(r) = wrong_code.first() {
                return Err(AttachError::Other(format!(
                    "{} runs of code differ from their files after the detach, the first at {:#x}: {:02x?} where the file has {:02x?}",
                    wrong_code.len(),
                    r.addr,
                    r.now,
                    r.file
                )));
            }
            if wrong_slots > 0 {
                return Err(AttachError::Other(format!(
                    "{wrong_slots} hook slots did not take back their values"
                )));
            }
            if inside {
                return Err(AttachError::Other(
                    "a thread stayed inside the runtime's code for 1 s; the sleds were restored all the same".into(),
                ));
            }
            let released = began.elapsed();
            // The reports, written while the program runs on.
            line.clear();
            answers.read_line(&mut line).map_err(AttachError::io(what))?;
            let files = match line.trim().strip_prefix("ok") {
                Some(rest) => rest.split_whitespace().map(PathBuf::from).collect(),
                None => return Err(AttachError::Other(format!("the runtime's reports: {}", line.trim()))),
            };
            // Its thread leaves the library for good once it has answered.
            let task = PathBuf::from(format!("/proc/{}/task/{writer}", self.pid));
            let until = Instant::now() + Duration::from_secs(5);
            while task.exists() && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(1));
            }
            if task.exists() {
                return Err(AttachError::Other(format!(
                    "the runtime's control thread {writer} did not end after the reports"
                )));
            }
            return Ok(Detached {
                files,
                released,
                sites_checked: sites.len(),
                late_sites,
                late_slots,
                slots_restored: bound.len(),
                code_restored: runs.len(),
                code_checked: regions.iter().map(|r| r.file.len() as u64).sum(),
                tries,
                total: began.elapsed(),
                all_stopped,
            });
        }
    }
}

/// What a runtime may have changed in some modules, found from their
/// files and the C library: their sleds, their hook slots with the C
/// library's hooks the loader bound them to, and their code. Of the
/// modules mapped since the attach ([`Session::late`]), or of all (a
/// detach on a killed command's behalf, [`recover`]).
struct Found {
    sites: Vec<Site>,
    bound: Vec<(bindings::Slot, u64)>,
    regions: Vec<code::Region>,
}

impl Found {
    fn of(maps: &[maps::Mapping], modules: &[maps::Module]) -> Result<Found> {
        let mut files = files::Files::new();
        let sites = sleds::of_modules(modules, &mut files)?;
        let slots = bindings::of_modules(modules, &mut files)?;
        let regions = code::regions(maps, &probed(maps, modules, &sites, &slots), &mut files);
        let bound = if slots.is_empty() {
            Vec::new()
        } else {
            let libc = symbols_in(maps, "libc.so.6", &bindings::HOOKS)?;
            slots.into_iter().map(|s| (s.clone(), libc[s.hook])).collect()
        };
        Ok(Found { sites, bound, regions })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_process_is_named() {
        // Beyond the default pid_max.
        let e = attach(
            4_194_304 + 7,
            &Options {
                library: "/nonexistent/libfastinst.so".into(),
                settings: vec![],
            },
        )
        .unwrap_err();
        assert!(matches!(e, AttachError::NoProcess(_)), "{e}");
    }

    #[test]
    fn a_library_named_otherwise_is_refused_before_the_process_is_touched() {
        // This very process: refused for the name, never looked at.
        let e = attach(
            std::process::id() as i32,
            &Options {
                library: "/opt/fastinst/libfastinst-1.so".into(),
                settings: vec![],
            },
        )
        .unwrap_err();
        assert!(matches!(e, AttachError::LibraryName(_)), "{e}");
        assert!(e.to_string().contains("must be named libfastinst.so"), "{e}");
    }

    #[test]
    fn a_thread_in_malloc_is_not_borrowed() {
        let maps =
            maps::parse("7f0000000000-7f0000100000 r-xp 00026000 08:01 77 /usr/lib/x86_64-linux-gnu/libc.so.6\n");
        // SAFETY: user_regs_struct is plain integers.
        let mut r: libc::user_regs_struct = unsafe { std::mem::zeroed() };
        r.orig_rax = u64::MAX;
        r.rip = 0x7f00_0000_1000;
        assert!(!safe_to_borrow(&r, &maps), "running inside libc");
        r.rip = 0x5555_0000_0000;
        assert!(safe_to_borrow(&r, &maps), "running in the program");
        r.orig_rax = 9;
        assert!(!safe_to_borrow(&r, &maps), "in mmap");
        r.orig_rax = 232;
        assert!(safe_to_borrow(&r, &maps), "in epoll_wait");
    }
}
