//! What a probe is: its id, metadata and the toggle strategies.

use providers::finstrument::SiteForm;
use std::ffi::CStr;

/// A probe's id: probes are numbered 0, 1, 2, ... in discovery order, and
/// an id is never reused. In C it is a `uint32_t` (`fastinst_probe_id`),
/// which this type is laid out as.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ProbeId(u32);

impl ProbeId {
    /// The id with this number.
    pub const fn new(n: u32) -> ProbeId {
        ProbeId(n)
    }

    /// Its number: the count of probes discovered before it.
    pub const fn get(self) -> u32 {
        self.0
    }

    /// The id after this one (a sled's exit probe follows its entry).
    pub(crate) const fn next(self) -> ProbeId {
        ProbeId(self.0 + 1)
    }
}

impl std::fmt::Display for ProbeId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// A probe handler: receives the id of the probe that fired.
pub type Handler = extern "C" fn(ProbeId);

/// Function entry or exit, or a point in a function.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ProbeKind {
    /// At function entry.
    Entry = 0,
    /// At function exit.
    Exit = 1,
    /// At a point in Rust code (`fastinst::probe!`): fires each time the
    /// point is passed; no exit, and never part of a function's timing.
    Point = 2,
}

/// Which provider found the site.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
#[non_exhaustive]
pub enum Provider {
    /// `-finstrument-functions` hook calls.
    Finstrument = 0,
    /// `-fpatchable-function-entry` NOP sleds listed in the ELF file
    /// (the runtime's `sled` module).
    Patchable = 1,
    /// `-pg` profiling calls (`mcount`, `__fentry__`) and `-mnop-mcount`
    /// NOPs, turned into sleds ([`providers::mcount`]).
    Mcount = 2,
    /// Point probes of Rust code (`fastinst::probe!`) listed in the
    /// `fastinst_points` section ([`providers::points`]).
    Point = 3,
    /// clang's `-fxray-instrument` entry sleds ([`providers::xray`]).
    Xray = 4,
}

/// How a probe's site is switched off.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
#[non_exhaustive]
pub enum Strategy {
    /// callpatch, one flipped opcode byte (the default: no trampoline, no
    /// wait, inactive cost of a NOP; valid at hook calls, whose callee
    /// follows the ABI).
    Flip = 0,
    /// callpatch as in the paper (NOP / `ret` trampoline / short jump).
    Paper = 1,
    /// wordpatch, synchronous: the whole call becomes a NOP (or `ret`).
    WordSync = 2,
    /// wordpatch, asynchronous: straddlers finish in the background.
    WordAsync = 3,
}

impl Strategy {
    /// Every strategy.
    pub const ALL: [Strategy; 4] = [Strategy::Flip, Strategy::Paper, Strategy::WordSync, Strategy::WordAsync];

    /// Its name: `flip`, `paper`, `word-sync`, `word-async`.
    pub fn name(self) -> &'static str {
        self.c_name().to_str().expect("ASCII names")
    }

    /// Its name as the C API returns it (`fastinst_strategy`).
    pub fn c_name(self) -> &'static CStr {
        match self {
            Strategy::Flip => c"flip",
            Strategy::Paper => c"paper",
            Strategy::WordSync => c"word-sync",
            Strategy::WordAsync => c"word-async",
        }
    }

    pub(crate) fn from_u8(v: u8) -> Strategy {
        match v {
            1 => Strategy::Paper,
            2 => Strategy::WordSync,
            3 => Strategy::WordAsync,
            _ => Strategy::Flip,
        }
    }
}

impl std::str::FromStr for Strategy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Strategy::ALL
            .into_iter()
            .find(|x| x.name() == s.trim())
            .ok_or_else(|| format!("`{s}` is not a strategy (flip, paper, word-sync, word-async)"))
    }
}

/// Everything known about a probe, fixed at discovery.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct ProbeMeta {
    /// Its id.
    pub id: ProbeId,
    /// Entry, exit or point.
    pub kind: ProbeKind,
    /// Address of the instrumented function (`this_fn`); for a point, the
    /// address of the module's first point of the same name (points have
    /// no function; this groups the copies of one point that inlining or
    /// unrolling made).
    pub function: usize,
    /// Demangled name of the function ("" when no symbol names it); for a
    /// point, its name.
    pub function_name: &'static CStr,
    /// Address of the site instruction (0 for an unrecognised site).
    pub site: usize,
    /// Length of the site instruction (0 for an unrecognised site).
    pub site_len: u8,
    /// Bytes of the site before the cache-line boundary it crosses, 0 if it
    /// does not straddle.
    pub split: u8,
    /// How the site reaches the hook; `None` for an unrecognised site, which
    /// is never patched: it stays on and deactivation only drops its calls.
    pub form: Option<SiteForm>,
    /// The provider.
    pub provider: Provider,
    /// Whether the load of `this_fn` was rewritten to pass the id.
    pub arg_rewritten: bool,
    /// Whether the site lies in another function's code: a copy of
    /// `function` that the compiler inlined there (gcc's
    /// `-finstrument-functions` keeps the hooks of inlined copies). False
    /// for the function's own code, which includes its clones
    /// (`.constprop`, `.isra`, `.part`) and split-off parts (`.cold`),
    /// whose hooks pass the function's own address too, and false where no
    /// symbol says.
    pub inlined: bool,
}

impl ProbeMeta {
    /// The function name as UTF-8 (lossy).
    pub fn name(&self) -> std::borrow::Cow<'static, str> {
        self.function_name.to_string_lossy()
    }

    /// True if the site can be patched (recognised).
    pub fn is_patchable(&self) -> bool {
        self.form.is_some()
    }
}
