//! A thread's call paths, interned as a trie: one node per distinct path
//! prefix, so a sampled call names its whole path with one node id.
//!
//! A sample used to carry its path as words (up to 49 frames' worth) that
//! were hashed and compared against a table of paths: on QuickJS, whose
//! paths run 20-40 items deep, that was the largest part of a sample's
//! cost. With the trie, a shadow-stack frame remembers the node of the path
//! that ends at it, and a sample extends its parent's node by one frame:
//! one lookup of a two-word key ([`super::thread::Shadow::path_node`]).

use super::thread::{FxMap, GAP};

/// Node id of the empty path.
pub(crate) const ROOT: u32 = 0;

/// Distinct path prefixes kept per thread. Past it, a sample whose path
/// needs a new node is kept as `[...];function` (which claims no caller)
/// and counted in the report's `stacks_merged`; an interpreter's recursion
/// makes hundreds of thousands of paths, and unbounded, the reports grew
/// to 90 MB.
pub const MAX_PATH_NODES: usize = 8192;

#[derive(Clone, Copy, Debug)]
struct Node {
    parent: u32,
    item: u64,
    /// Samples whose path ends here, and their self ticks.
    samples: u64,
    self_ticks: u64,
}

/// The trie. Items are those of a path ([`super::thread`]): a function
/// index, [`GAP`], or a caller named by return address.
pub(crate) struct Paths {
    nodes: Vec<Node>,
    children: FxMap<(u32, u64), u32>,
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
                item: GAP,
                samples: 0,
                self_ticks: 0,
            }],
            children: FxMap::default(),
            merged: Vec::new(),
        }
    }
}

impl Paths {
    /// The node of path `parent` followed by `item`; `None` when that is a
    /// new node and the table is full.
    #[inline]
    pub(crate) fn child(&mut self, parent: u32, item: u64) -> Option<u32> {
        if let Some(&n) = self.children.get(&(parent, item)) {
            return Some(n);
        }
        (self.nodes.len() < MAX_PATH_NODES).then(|| self.insert(parent, item))
    }

    fn insert(&mut self, parent: u32, item: u64) -> u32 {
        let n = self.nodes.len() as u32;
        self.nodes.push(Node {
            parent,
            item,
            samples: 0,
            self_ticks: 0,
        });
        self.children.insert((parent, item), n);
        n
    }

    /// The node of `path`, from the root; `None` when the table is full.
    pub(crate) fn intern(&mut self, path: &[u64]) -> Option<u32> {
        path.iter().try_fold(ROOT, |n, &item| self.child(n, item))
    }

    /// The node of `[...];function`, made even past the bound: there is
    /// one per function at most.
    pub(crate) fn merged(&mut self, func: u32) -> u32 {
        let i = func as usize;
        if let Some(&n) = self.merged.get(i).filter(|&&n| n != ROOT) {
            return n;
        }
        let gap = match self.children.get(&(ROOT, GAP)) {
            Some(&n) => n,
            None => self.insert(ROOT, GAP),
        };
        let n = match self.children.get(&(gap, u64::from(func))) {
            Some(&n) => n,
            None => self.insert(gap, u64::from(func)),
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

    /// Every path that ends a sample: (items outermost first, samples,
    /// self ticks).
    pub(crate) fn sampled(&self) -> impl Iterator<Item = (Vec<u64>, u64, u64)> + '_ {
        self.nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| n.samples > 0)
            .map(|(i, n)| (self.path_of(i as u32), n.samples, n.self_ticks))
    }

    /// The items of `node`'s path, outermost first.
    pub(crate) fn path_of(&self, mut node: u32) -> Vec<u64> {
        let mut path = Vec::new();
        while node != ROOT {
            let n = &self.nodes[node as usize];
            path.push(n.item);
            node = n.parent;
        }
        path.reverse();
        path
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
    use crate::profile::thread::CALLER_TAG;

    #[test]
    fn a_path_interned_reads_back_and_shares_its_prefixes() {
        let mut t = Paths::default();
        let a = [CALLER_TAG | 0x401000, 3, 7];
        let b = [CALLER_TAG | 0x401000, 3, GAP, 9];
        let na = t.intern(&a).unwrap();
        let nb = t.intern(&b).unwrap();
        assert_eq!(t.path_of(na), a);
        assert_eq!(t.path_of(nb), b);
        assert_eq!(t.intern(&a), Some(na));
        // root, the caller, 3, then 7; GAP and 9.
        assert_eq!(t.len(), 6);
        t.add(na, 5);
        t.add(na, 6);
        t.add(nb, 1);
        let mut got: Vec<_> = t.sampled().collect();
        got.sort();
        assert_eq!(got, vec![(a.to_vec(), 2, 11), (b.to_vec(), 1, 1)]);
    }

    #[test]
    fn a_full_table_refuses_new_paths_but_keeps_merged_ones() {
        let mut t = Paths::default();
        for i in 1..MAX_PATH_NODES as u64 {
            assert!(t.child(ROOT, i).is_some());
        }
        assert_eq!(t.child(ROOT, 5), Some(5), "known nodes are still found");
        assert_eq!(t.child(ROOT, u64::MAX - 1), None);
        let m = t.merged(42);
        assert_eq!(t.path_of(m), vec![GAP, 42]);
        assert_eq!(t.merged(42), m);
    }
}
