//! The one error type of this crate.

/// Why a patch was refused. Nothing was written when one of these is returned,
/// except where the variant says otherwise.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A patch must be 1..=8 bytes long.
    #[error("patch length {0} is out of range 1..=8")]
    InvalidLength(usize),
    /// The address is not inside any mapping of this process.
    #[error("address {addr:#x} is not mapped")]
    NotMapped {
        /// The first unmapped byte.
        addr: usize,
    },
    /// The address is mapped, but not executable: this crate patches code only.
    #[error("address {addr:#x} is not in an executable mapping")]
    NotExecutable {
        /// The first byte found in a non-executable page.
        addr: usize,
    },
    /// `mprotect` refused to make a code page writable.
    #[error("cannot make page {page:#x} writable: errno {errno}")]
    Protect {
        /// The page that stayed read-only.
        page: usize,
        /// The errno `mprotect` returned.
        errno: i32,
    },
    /// More distinct code pages were made writable than the page table holds.
    #[error("too many patched code pages (limit {limit})")]
    TooManyPages {
        /// The table's capacity.
        limit: usize,
    },
    /// A straddler patch left its wait to the default, and no wait is
    /// proven safe here ([`WaitSource::Unproven`](crate::WaitSource::Unproven)).
    #[error(
        "site {site:#x} straddles a cache line and no wait is proven safe on this machine (no membarrier SYNC_CORE, no machine config): run `fastinst calibrate`, or set FASTINST_WAIT=tmax:TICKS to accept an unproven wait"
    )]
    NoProvenWait {
        /// The straddling site.
        site: usize,
    },
    /// Another straddling patch holds the INT3 lock on this very site.
    #[error("site {site:#x} is locked by another patch in flight")]
    SiteLocked {
        /// The site.
        site: usize,
    },
    /// A patch in flight covers some of these bytes but starts elsewhere.
    #[error("patch at {site:#x} overlaps the patch in flight at {other:#x}")]
    OverlapInFlight {
        /// The refused patch.
        site: usize,
        /// The patch in flight it collides with.
        other: usize,
    },
    /// The caller stated the current bytes and the code holds others.
    #[error("bytes at {site:#x} are {found:02x?}, expected {expected:02x?}")]
    Unexpected {
        /// The site.
        site: usize,
        /// What the code holds.
        found: crate::CodeBytes,
        /// What the caller said it holds.
        expected: crate::CodeBytes,
    },
    /// The INT3 lock cannot be told apart from a straddling patch whose new
    /// first byte is itself INT3, so such a patch is refused.
    #[error("a straddling patch at {site:#x} may not start with the INT3 byte 0xcc")]
    StartsWithInt3 {
        /// The site.
        site: usize,
    },
    /// Every slot of the table of straddling patches in flight near this site is
    /// taken: finish some (see [`flush`](crate::flush)) and retry.
    #[error("too many straddling patches in flight near {site:#x}")]
    TooManyInFlight {
        /// The site.
        site: usize,
    },
    /// The insert-only set of straddling sites is full.
    #[error("too many distinct straddling sites (limit {limit})")]
    TooManyStraddlerSites {
        /// The set's capacity.
        limit: usize,
    },
    /// The kernel lacks `MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE` (Linux >= 4.16 on x86).
    #[error("membarrier SYNC_CORE is unavailable: {0}")]
    SyncCoreUnsupported(String),
    /// Making a writable alias of a code mapping (W^X) failed; the code is
    /// as it was.
    #[error("cannot alias the code mapping at {page:#x} ({step}): errno {errno}")]
    Alias {
        /// The mapping's first page.
        page: usize,
        /// What failed.
        step: &'static str,
        /// The errno, 0 where none applies.
        errno: i32,
    },
    /// Every slot of the table of aliased mappings is taken.
    #[error("too many aliased code mappings (limit {limit})")]
    TooManyAliases {
        /// The table's capacity.
        limit: usize,
    },
    /// Installing a signal handler (SIGTRAP's for the INT3 lock, SIGSEGV's,
    /// or the evacuation's) failed.
    #[error("cannot install a signal handler: errno {0}")]
    SignalHandler(i32),
    /// This process's threads could not be listed (`/proc/self/task`), so
    /// none could be checked by [`evacuate`](crate::evacuate).
    #[error("cannot list this process's threads in /proc/self/task: errno {0}")]
    ThreadList(i32),
    /// Every real-time signal has a disposition already, so none is left
    /// for [`evacuate`](crate::evacuate) to ask threads where they are.
    #[error("no real-time signal is left at its default disposition to ask threads where they are")]
    NoFreeSignal,
}
