//! The slow-path lookup: a lock-free open-addressing table from keys (return
//! addresses, function keys, patched-instruction addresses) to values.
//!
//! Fixed capacity, never resized, so readers need no lock: an insert writes
//! the value, then publishes the key with Release; a reader that sees the key
//! (Acquire) sees the value. Inserts are serialised by the caller
//! (discovery). Removal leaves a tombstone.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

const BITS: u32 = 20;
/// Slots in the table.
pub const CAPACITY: usize = 1 << BITS;
const EMPTY: u64 = 0;
const TOMBSTONE: u64 = 1;

/// Key spaces: code addresses are below 2^47, so the top bits are free.
pub(crate) mod key {
    /// A call site's return address (what the hook sees).
    pub const fn ret(addr: u64) -> u64 {
        addr
    }
    /// The probe of function `f`'s `kind` hook where no return address
    /// locates it (a tail jump, an unrecognised site).
    pub const fn function(f: u64, kind: u8) -> u64 {
        (1 << 62) | ((kind as u64) << 56) | f
    }
    /// Present when function `f` has more than one tail-jump exit: calls
    /// that find its tail probe switched off may come from its other tail
    /// sites, which no return address tells apart, so they are not taken
    /// for undiscovered sites (`hooks::undiscovered_call`).
    pub const fn tails_ambiguous(f: u64) -> u64 {
        (1 << 62) | (2 << 56) | f
    }
    /// The size of the function starting at `f`, from its symbol
    /// (published by discovery before any callback hears of its probes).
    pub const fn extent(f: u64) -> u64 {
        (1 << 62) | (3 << 56) | f
    }
    /// Where the body of the function at `f` starts, as an offset from `f`
    /// (an `i32`'s bits), when `f` is a sled function that jumps to it
    /// (`crate::sled::body_of`).
    pub const fn body(f: u64) -> u64 {
        (1 << 62) | (4 << 56) | f
    }
    /// A site or rewritten instruction the runtime patches, by address;
    /// the value is its length (the decode overlay) or its probe id.
    pub const fn patched(addr: u64) -> u64 {
        (2 << 62) | addr
    }
    /// A site's probe, by the site's address (dedupe).
    pub const fn site(addr: u64) -> u64 {
        (3 << 62) | addr
    }
}

/// A key and its value side by side, four to a cache line: a lookup that
/// misses the caches loads one line, not a key's line and then its value's
/// (the two arrays this table used to be), and a code page's block is two
/// table pages, not three.
#[repr(C)]
struct Slot {
    key: AtomicU64,
    val: AtomicU32,
}

const _: () = assert!(std::mem::size_of::<Slot>() == 16);

// Page-aligned, so a block is exactly two pages (`prepare`).
#[repr(C, align(4096))]
struct Table {
    slots: [Slot; CAPACITY],
}

static TABLE: Table = Table {
    slots: [const {
        Slot {
            key: AtomicU64::new(EMPTY),
            val: AtomicU32::new(0),
        }
    }; CAPACITY],
};

/// Slots per block (log2): the keys of one 4 KiB code page, two table
/// pages.
const WITHIN: u32 = 9;
/// The code address inside a key: below the key spaces (bits 62-63) and
/// the sub-kinds of space 1 (bits 56-57).
const ADDR: u64 = (1 << 56) - 1;

/// A key's home slot. The keys of one code page share a block of 512
/// slots placed by a Fibonacci hash of the page. Why not hash the whole
/// key: start-up inserts thousands of keys, and a hash that scatters them
/// touches a fresh page of this 16 MiB table (a page fault, about a
/// microsecond) for most of them: 5,000 faults at SQLite's start with sled
/// probes. Keyed by page, a code page's keys of every kind share one block
/// (two table pages; three before keys and values were interleaved); the
/// block is placed by the address alone, never by the kind, or each kind
/// would take pages of its own (it did: QuickJS's function extents doubled
/// its start-up faults).
///
/// Inside the block, the keys registration makes for every probe
/// (`extent`, `patched`, `site`) live in its second page and the keys
/// only `-finstrument-functions` hooks look up (`ret`, `function`,
/// `tails_ambiguous`) in its first, so a sled build, which has none of the
/// latter, touches one table page per code page, not two (its start-up
/// faulted both in for ~1,500 sleds on SQLite's 250 code pages, a fifth of
/// its registration). Inside its page a key's home is its page offset /
/// 16, turned by a few dozen slots per kind (so a site's keys of several
/// kinds do not contend for one home): a slot per 16 bytes of code and
/// page, so a page of ordinary functions fills a small part of its block.
/// A key's probe sequence is [`RUN`] slots from its home, within its table
/// page (a line or a few), and then as many in the same page of another
/// block, placed by the page and the level ([`Probes`]).
#[inline(always)]
fn slot(k: u64) -> usize {
    Probes::new(k).at()
}

/// Slots a key's probe sequence visits in one block before it moves on to
/// the next level's block. A code page of tiny functions (a page of
/// 16-byte sled functions has 768 registration keys for 256 slots) fills
/// its page; run on linearly, as the sequence once did, its keys ran into
/// the next blocks' pages in one cluster of hundreds of slots that every
/// look-up of a key not there walked to its end (most of a 20,000-function
/// program's registration time went to such walks). Moving on by level,
/// each page's overflow takes a page of another block, and a look-up walks
/// a few short runs.
const RUN: usize = 16;

/// The slots a look-up or insert of one key visits, in order.
#[derive(Clone, Copy)]
struct Probes {
    /// The key's code page (its address bits above the page offset).
    page: u64,
    /// The table page of the block (0 or [`HALF`]).
    half: usize,
    /// The first slot of that table page in this level's block: the block
    /// is hashed once a level, not once a slot (look-ups run on the
    /// `-finstrument-functions` hooks' path).
    base: usize,
    /// The key's home inside its table page.
    home: usize,
    /// Which block: 0 for the page's own, then one more each [`RUN`].
    level: u64,
    /// Slots visited in this level's block.
    step: usize,
}

impl Probes {
    #[inline(always)]
    fn new(k: u64) -> Self {
        let addr = k & ADDR;
        // k >> 55: the space times 128 plus the sub-kind times 2 (bit 55 of a
        // code address is 0), one shift on the hook's path.
        let kind = (k >> 55) as usize;
        let page = addr >> 12;
        let half = usize::from(kind >= REGISTRATION) * HALF;
        Probes {
            page,
            half,
            base: Self::block(page, 0) | half,
            home: ((addr >> 4) as usize + kind + (kind >> 1)) & (HALF - 1),
            level: 0,
            step: 0,
        }
    }

    /// The first slot of code page `page`'s block at `level`: level 0 is
    /// the page's own block; a later level's is the page's hash with the
    /// level in bits above any page number.
    #[inline(always)]
    fn block(page: u64, level: u64) -> usize {
        let h = (page ^ (level << 45)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        ((h >> (64 - (BITS - WITHIN))) as usize) << WITHIN
    }

    /// The slot the sequence is at.
    #[inline(always)]
    fn at(&self) -> usize {
        self.base | ((self.home + self.step) & (HALF - 1))
    }

    /// Moves to the next slot of the sequence.
    #[inline(always)]
    fn advance(&mut self) {
        self.step += 1;
        if self.step == RUN {
            self.step = 0;
            self.level += 1;
            self.base = Self::block(self.page, self.level) | self.half;
        }
    }
}

/// Slots per table page of a block.
const HALF: usize = 1 << (WITHIN - 1);
/// The first `k >> 55` of the keys registration makes (`extent`, then the
/// `patched` and `site` spaces), which live in a block's second page.
const REGISTRATION: usize = (key::extent(0) >> 55) as usize;
const _: () = assert!(HALF * std::mem::size_of::<Slot>() == 4096);
const _: () = assert!((key::tails_ambiguous(0) >> 55) < (key::extent(0) >> 55));
const _: () = assert!((key::extent(0) >> 55) < (key::patched(0) >> 55));
const _: () = assert!((key::patched(0) >> 55) < (key::site(0) >> 55));

/// Faults in, for writing, the two table pages that hold the keys of code
/// page `addr` ([`prepare_registration`]: the one page a sled needs).
/// Start-up calls it before it looks up and inserts a code page's keys: a
/// first read of an untouched page maps the shared zero page and the
/// insert after it faults a second time to copy it, so reading first
/// doubled the faults. A compare-exchange of 0 for 0 changes nothing, so
/// it is safe beside concurrent readers and inserts, and it is a locked
/// write whether or not it matches, so the kernel maps the page writable
/// at once. (`fetch_or(0)` would not do: the compiler turns an idempotent
/// relaxed read-modify-write into a plain load.)
pub(crate) fn prepare(addr: u64) {
    let block = block_of(addr);
    for i in [block, block + HALF] {
        touch(i);
    }
}

/// [`prepare`] for the keys registration makes (`extent`, `patched`,
/// `site`) alone: the block's second page.
pub(crate) fn prepare_registration(addr: u64) {
    touch(block_of(addr) + HALF);
}

/// The first slot of the block that holds the keys of code page `addr`.
fn block_of(addr: u64) -> usize {
    slot(addr & ADDR & !0xfff) & !((1 << WITHIN) - 1)
}

fn touch(i: usize) {
    let _ = TABLE.slots[i]
        .key
        .compare_exchange(EMPTY, EMPTY, Ordering::Relaxed, Ordering::Relaxed);
}

/// The slot where a look-up of `k` starts.
#[inline(always)]
pub(crate) fn slot_of(k: u64) -> u32 {
    slot(k) as u32
}

/// Starts loading slot `i`'s line (see [`slot_of`]).
#[inline(always)]
pub(crate) fn prefetch_slot(i: u32) {
    if let Some(s) = TABLE.slots.get(i as usize) {
        crate::prefetch::line(s);
    }
}

/// The value under `k`. Lock-free.
#[inline(always)]
pub fn get(k: u64) -> Option<u32> {
    let mut p = Probes::new(k);
    for _ in 0..CAPACITY {
        let s = &TABLE.slots[p.at()];
        let cur = s.key.load(Ordering::Acquire);
        if cur == k {
            return Some(s.val.load(Ordering::Relaxed));
        }
        if cur == EMPTY {
            return None;
        }
        p.advance();
    }
    None
}

/// The probe under `k` (a site, return-address or function key).
#[inline(always)]
pub(crate) fn probe(k: u64) -> Option<crate::probe::ProbeId> {
    get(k).map(crate::probe::ProbeId::new)
}

/// Inserts or replaces `k -> v`; `false` if the table is full (the runtime
/// keeps it under 3/4 full and refuses new probes past that).
pub(crate) fn insert(k: u64, v: u32) -> bool {
    debug_assert!(k > TOMBSTONE);
    let mut p = Probes::new(k);
    let mut free = None;
    for _ in 0..CAPACITY {
        let i = p.at();
        let s = &TABLE.slots[i];
        let cur = s.key.load(Ordering::Relaxed);
        if cur == k {
            s.val.store(v, Ordering::Relaxed);
            return true;
        }
        if cur == TOMBSTONE && free.is_none() {
            free = Some(i);
        }
        if cur == EMPTY {
            let at = &TABLE.slots[free.unwrap_or(i)];
            at.val.store(v, Ordering::Relaxed);
            at.key.store(k, Ordering::Release);
            return true;
        }
        p.advance();
    }
    false
}

/// Removes `k` (a tombstone keeps later probes reachable).
pub(crate) fn remove(k: u64) {
    let mut p = Probes::new(k);
    for _ in 0..CAPACITY {
        let s = &TABLE.slots[p.at()];
        let cur = s.key.load(Ordering::Relaxed);
        if cur == k {
            s.key.store(TOMBSTONE, Ordering::Release);
            return;
        }
        if cur == EMPTY {
            return;
        }
        p.advance();
    }
}

/// Slots a look-up of `k` visits before it finds `k` or an empty slot.
#[cfg(test)]
fn probes_for(k: u64) -> usize {
    let mut p = Probes::new(k);
    let mut n = 1;
    loop {
        let cur = TABLE.slots[p.at()].key.load(Ordering::Relaxed);
        if cur == k || cur == EMPTY {
            return n;
        }
        p.advance();
        n += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_get_remove() {
        let base = 0x7777_0000_0000u64;
        for i in 0..1000 {
            assert!(insert(key::ret(base + i * 5), i as u32));
        }
        for i in 0..1000 {
            assert_eq!(get(key::ret(base + i * 5)), Some(i as u32));
        }
        assert_eq!(get(key::function(base, 1)), None);
        remove(key::ret(base + 5));
        assert_eq!(get(key::ret(base + 5)), None);
        assert_eq!(get(key::ret(base + 10)), Some(2));
        assert!(insert(key::ret(base + 5), 77));
        assert_eq!(get(key::ret(base + 5)), Some(77));
        for i in 0..1000 {
            remove(key::ret(base + i * 5));
        }
    }

    #[test]
    fn every_kind_of_key_of_a_code_page_lives_in_its_block() {
        // Start-up faults in a block's two table pages per code page; a
        // kind of key hashed to another block would cost two more.
        let page = 0x5555_1234_5000u64;
        for off in [0u64, 5, 0x7ff, 0xffb] {
            let a = page + off;
            let keys = [
                key::ret(a),
                key::function(a, 0),
                key::function(a, 1),
                key::tails_ambiguous(a),
                key::extent(a),
                key::patched(a),
                key::site(a),
            ];
            let homes: std::collections::HashSet<usize> = keys.iter().map(|&k| slot(k)).collect();
            assert_eq!(homes.len(), keys.len(), "kinds of key share a home slot");
            assert!(homes.iter().all(|h| h >> WITHIN == slot(page) >> WITHIN), "{homes:x?}");
        }
        assert_ne!(slot(page) >> WITHIN, slot(page + 0x1000) >> WITHIN);
    }

    #[test]
    fn registration_keys_of_a_code_page_share_one_table_page() {
        // A sled build registers only these three kinds; the hooks' kinds
        // live in the block's other page.
        let page = 0x5555_1234_5000u64;
        let table_page = |k: u64| slot(k) / HALF;
        let first = table_page(key::site(page));
        for off in 0..0x1000u64 {
            let a = page + off;
            for k in [key::extent(a), key::patched(a), key::site(a)] {
                assert_eq!(table_page(k), first, "{k:#x}");
            }
            for k in [
                key::ret(a),
                key::function(a, 0),
                key::function(a, 1),
                key::tails_ambiguous(a),
            ] {
                assert_eq!(table_page(k), first - 1, "{k:#x}");
            }
        }
        // `prepare_registration` touches exactly that page.
        assert_eq!(block_of(page) + HALF, first * HALF);
    }

    #[test]
    fn a_page_of_tiny_functions_leaves_look_ups_short() {
        // 256 sled functions of 16 bytes on each of 8 code pages, each
        // with the three keys registration makes: three times what a
        // page's half block holds. Run on linearly, the keys made one
        // cluster that a look-up of an absent key (a C function's `body`,
        // a new site's dedupe) walked to its end: hundreds of slots.
        let base = 0x4444_0001_0000u64;
        let fs: Vec<u64> = (0..8 * 256u64).map(|i| base + i * 16).collect();
        for &f in &fs {
            for k in [key::extent(f), key::patched(f), key::site(f)] {
                assert!(insert(k, 5));
            }
        }
        let mut worst = 0;
        for &f in &fs {
            for k in [
                key::extent(f),
                key::patched(f),
                key::site(f),
                key::body(f),
                key::site(f + 3),
            ] {
                worst = worst.max(probes_for(k));
            }
            assert_eq!(get(key::site(f)), Some(5));
            assert_eq!(get(key::body(f)), None);
        }
        assert!(worst <= 6 * RUN, "a look-up visits {worst} slots");
        for &f in &fs {
            for k in [key::extent(f), key::patched(f), key::site(f)] {
                remove(k);
            }
        }
    }

    #[test]
    fn a_dense_page_in_every_key_space_spills_into_later_blocks() {
        // 4 x 4,096 keys of one code page (every byte): 32 times what its
        // block holds.
        let base = 0x6666_0000_1000u64;
        let keys: Vec<u64> = (0..4096u64)
            .flat_map(|i| {
                let a = base + i;
                [key::ret(a), key::patched(a), key::site(a), key::function(a, 1)]
            })
            .collect();
        for (v, &k) in keys.iter().enumerate() {
            assert!(insert(k, v as u32));
        }
        for (v, &k) in keys.iter().enumerate() {
            assert_eq!(get(k), Some(v as u32));
        }
        for &k in &keys {
            remove(k);
        }
        assert!(keys.iter().all(|&k| get(k).is_none()));
    }
}
