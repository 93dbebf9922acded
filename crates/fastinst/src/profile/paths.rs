//! A thread's call paths, interned as a trie: one node per distinct path
//! prefix, so a sampled call names its whole path with one node id.
//!
//! A sample used to carry its path as words (up to 49 frames' worth) that
//! were hashed and compared against a table of paths: on QuickJS, whose
//! paths run 20-40 items deep, that was the largest part of a sample's
//! cost. With the trie, a shadow-stack frame remembers the node of the path
//! that ends at it, and a sample extends its parent's node by one frame.
//! A frame adds up to three items (a gap, its caller, itself), packed into
//! one [`Segment`] key: one lookup per frame
//! ([`super::thread::Shadow::path_end`]), and the last of them is made
//! when the sample is folded, a few samples after its line was prefetched.

use super::table::{mix, OpenTable, Slot};

/// Path items: a function index, or these markers.
pub(crate) const GAP: u64 = u64::MAX;
/// Tag of a caller named by its return address (an unsampled frame).
pub(crate) const CALLER_TAG: u64 = 1 << 63;

/// Node id of the empty path.
pub(crate) const ROOT: u32 = 0;

pub use fastinst_report::MAX_PATH_NODES;

// A node id is kept in 16 bits in the child table's slots.
const _: () = assert!(MAX_PATH_NODES <= u16::MAX as usize + 1);

/// What one frame adds to a path, in order: a [`GAP`] (`gap`), its caller
/// named by return address (`caller`, 0: none), and its function (`func`,
/// [`Segment::NO_FUNC`]: none, for a frame left off the path).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Segment {
    pub caller: u64,
    pub func: u32,
    pub gap: bool,
}

impl Segment {
    /// `func` of a segment that is only a gap.
    pub(crate) const NO_FUNC: u32 = u32::MAX;
    /// A lone [`GAP`].
    pub(crate) const GAP: Segment = Segment {
        caller: 0,
        func: Segment::NO_FUNC,
        gap: true,
    };

    /// Its path items, in order.
    pub(crate) fn items(self) -> impl Iterator<Item = u64> {
        let gap = self.gap.then_some(GAP);
        let caller = (self.caller != 0).then_some(CALLER_TAG | self.caller);
        let func = (self.func != Segment::NO_FUNC).then_some(u64::from(self.func));
        gap.into_iter().chain(caller).chain(func)
    }
}

/// Where a sample's call path ends, as the exit handler works it out: the
/// lookup of its last step is left to the fold ([`Paths::resolve`]), which
/// prefetches it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PathEnd {
    /// No node: the table was full on the way (`[...];function`).
    Merged,
    /// This node.
    At(u32),
    /// This node's child by this segment.
    Child(u32, Segment),
}

#[derive(Clone, Copy, Debug)]
struct Node {
    parent: u32,
    seg: Segment,
    /// Samples whose path ends here, and their self ticks.
    samples: u64,
    self_ticks: u64,
}

/// A trie edge: node `parent` followed by a segment is node `node`. One
/// 16-byte slot: the segment's caller with its gap flag in the top bit (a
/// return address never has it), its function, and both node ids.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
struct Child {
    caller_gap: u64,
    func: u32,
    parent: u16,
    node: u16,
}

/// [`Child`]'s key: the parent node and the segment, packed as in the slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ChildKey {
    caller_gap: u64,
    func: u32,
    parent: u16,
}

impl ChildKey {
    #[inline(always)]
    fn new(parent: u32, seg: Segment) -> ChildKey {
        ChildKey {
            caller_gap: seg.caller | (u64::from(seg.gap) << 63),
            func: seg.func,
            parent: parent as u16,
        }
    }
}

impl Slot for Child {
    type Key = ChildKey;
    /// A caller of `2^63 - 1` with the gap flag: no return address.
    const EMPTY: Child = Child {
        caller_gap: u64::MAX,
        func: 0,
        parent: 0,
        node: 0,
    };
    #[inline(always)]
    fn key(&self) -> Option<ChildKey> {
        (self.caller_gap != u64::MAX).then_some(ChildKey {
            caller_gap: self.caller_gap,
            func: self.func,
            parent: self.parent,
        })
    }
    fn new(k: ChildKey) -> Child {
        Child {
            caller_gap: k.caller_gap,
            func: k.func,
            parent: k.parent,
            node: 0,
        }
    }
    #[inline(always)]
    fn hash(k: &ChildKey) -> u64 {
        mix(mix(0, k.caller_gap), u64::from(k.func) << 16 | u64::from(k.parent))
    }
}

/// The trie of [`Segment`]s. Its paths' items are those of
/// [`super::thread`]: a function index, [`GAP`], or a caller named by
/// return address.
pub(crate) struct Paths {
    nodes: Vec<Node>,
    children: OpenTable<Child>,
    /// By function: the node of `[...];function`, or [`ROOT`] for none
    /// yet. Once the table is full most samples land here (SQLite fills
    /// it early in its run), and two lookups in `children` were two cache
    /// misses per sample.
    merged: Vec<u32>,
}

impl Default for Paths {
    fn default() -> Self {
        Paths {
            nodes: vec![Node {
                parent: ROOT,
                seg: Segment::GAP,
                samples: 0,
                self_ticks: 0,
            }],
            children: OpenTable::default(),
            merged: Vec::new(),
        }
    }
}

impl Paths {
    /// The node of path `parent` followed by `seg`; `None` when that is a
    /// new node and the table is full.
    #[inline]
    pub(crate) fn child(&mut self, parent: u32, seg: Segment) -> Option<u32> {
        let key = ChildKey::new(parent, seg);
        if let Some(c) = self.children.get(&key) {
            return Some(u32::from(c.node));
        }
        (self.nodes.len() < MAX_PATH_NODES).then(|| self.insert(parent, seg))
    }

    /// Starts loading what [`child`](Self::child) of `parent` and `seg`
    /// reads.
    #[inline(always)]
    pub(crate) fn prefetch_child(&self, parent: u32, seg: Segment) {
        self.children.prefetch(&ChildKey::new(parent, seg));
    }

    /// The node a sample's [`PathEnd`] names; `None` when it needs a new
    /// node and the table is full.
    #[inline]
    pub(crate) fn resolve(&mut self, end: PathEnd) -> Option<u32> {
        match end {
            PathEnd::Merged => None,
            PathEnd::At(node) => Some(node),
            PathEnd::Child(parent, seg) => self.child(parent, seg),
        }
    }

    /// A new node under `parent`, found again by [`child`](Self::child).
    fn insert(&mut self, parent: u32, seg: Segment) -> u32 {
        let n = self.push(parent, seg);
        let (slot, _) = self.children.get_or_insert(ChildKey::new(parent, seg));
        slot.node = n as u16;
        n
    }

    fn push(&mut self, parent: u32, seg: Segment) -> u32 {
        let n = self.nodes.len() as u32;
        self.nodes.push(Node {
            parent,
            seg,
            samples: 0,
            self_ticks: 0,
        });
        n
    }

    /// The node of the path made of `segs`, from the root; `None` when the
    /// table is full.
    pub(crate) fn intern(&mut self, segs: &[Segment]) -> Option<u32> {
        segs.iter().try_fold(ROOT, |n, &seg| self.child(n, seg))
    }

    /// Whether no new node fits.
    #[cfg(test)]
    pub(crate) fn is_full(&self) -> bool {
        self.nodes.len() >= MAX_PATH_NODES
    }

    /// The node of `[...];function`, made even past the bound: there is
    /// one per function at most.
    pub(crate) fn merged(&mut self, func: u32) -> u32 {
        let i = func as usize;
        if let Some(&n) = self.merged.get(i).filter(|&&n| n != ROOT) {
            return n;
        }
        // The segment a frame with no known caller makes.
        let seg = Segment {
            caller: 0,
            func,
            gap: true,
        };
        let n = match self.children.get(&ChildKey::new(ROOT, seg)) {
            Some(c) => u32::from(c.node),
            // Only once the table is full, which it then stays: a lookup
            // of this segment as a child finds no room and comes back
            // here, so the node is not in the child table (whose 16-bit
            // ids it may exceed, one per function past the bound).
            None => self.push(ROOT, seg),
        };
        if i >= self.merged.len() {
            self.merged.resize((i + 64).next_multiple_of(64), ROOT);
        }
        self.merged[i] = n;
        n
    }

    /// Counts a sample whose path ends at `node`.
    #[inline]
    pub(crate) fn add(&mut self, node: u32, self_ticks: u64) {
        let n = &mut self.nodes[node as usize];
        n.samples += 1;
        n.self_ticks += self_ticks;
    }

    /// Where `node`'s counters live, to prefetch.
    #[inline]
    pub(crate) fn slot(&self, node: u32) -> *const u64 {
        std::ptr::addr_of!(self.nodes[node as usize].samples)
    }

    /// Every node, the root first and each parent before its children:
    /// (parent, segment, samples, self ticks).
    pub(crate) fn snapshot(&self) -> Vec<(u32, Segment, u64, u64)> {
        self.nodes
            .iter()
            .map(|n| (n.parent, n.seg, n.samples, n.self_ticks))
            .collect()
    }

    /// Every path that ends a sample: (its node, samples, self ticks).
    #[cfg(test)]
    pub(crate) fn sampled(&self) -> impl Iterator<Item = (u32, u64, u64)> + '_ {
        self.nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| n.samples > 0)
            .map(|(i, n)| (i as u32, n.samples, n.self_ticks))
    }

    /// The items of `node`'s path, outermost first.
    #[cfg(test)]
    pub(crate) fn path_of(&self, mut node: u32) -> Vec<u64> {
        let mut segs = Vec::new();
        while node != ROOT {
            let n = &self.nodes[node as usize];
            segs.push(n.seg);
            node = n.parent;
        }
        segs.iter().rev().flat_map(|s| s.items()).collect()
    }

    /// Nodes in use (the root included).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.nodes.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(gap: bool, caller: u64, func: u32) -> Segment {
        Segment { caller, func, gap }
    }

    #[test]
    fn a_path_interned_reads_back_and_shares_its_prefixes() {
        let mut t = Paths::default();
        let a = [seg(false, 0x401000, 3), seg(false, 0, 7)];
        let b = [seg(false, 0x401000, 3), seg(true, 0, 9)];
        let na = t.intern(&a).unwrap();
        let nb = t.intern(&b).unwrap();
        assert_eq!(t.path_of(na), [CALLER_TAG | 0x401000, 3, 7]);
        assert_eq!(t.path_of(nb), [CALLER_TAG | 0x401000, 3, GAP, 9]);
        assert_eq!(t.intern(&a), Some(na));
        // root, the first frame, then one node each.
        assert_eq!(t.len(), 4);
        t.add(na, 5);
        t.add(na, 6);
        t.add(nb, 1);
        let mut got: Vec<_> = t.sampled().map(|(n, k, ticks)| (t.path_of(n), k, ticks)).collect();
        got.sort();
        assert_eq!(
            got,
            vec![
                (vec![CALLER_TAG | 0x401000, 3, 7], 2, 11),
                (vec![CALLER_TAG | 0x401000, 3, GAP, 9], 1, 1)
            ]
        );
        let cut = t.intern(&[Segment::GAP, seg(false, 0x2000, 4)]).unwrap();
        assert_eq!(t.path_of(cut), [GAP, CALLER_TAG | 0x2000, 4]);
    }

    #[test]
    fn a_full_table_refuses_new_paths_but_keeps_merged_ones() {
        let mut t = Paths::default();
        for i in 1..MAX_PATH_NODES as u32 {
            assert!(t.child(ROOT, seg(false, 0, i)).is_some());
        }
        assert!(t.is_full());
        assert_eq!(t.child(ROOT, seg(false, 0, 5)), Some(5), "known nodes are still found");
        assert_eq!(t.child(ROOT, seg(false, 0, u32::MAX - 1)), None);
        let m = t.merged(42);
        assert_eq!(t.path_of(m), vec![GAP, 42]);
        assert_eq!(t.merged(42), m);
    }
}
