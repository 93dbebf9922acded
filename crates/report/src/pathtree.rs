//! The report's call paths: every thread's paths merged into one tree by
//! the names their frames print as, and listed in the order their folded
//! lines sort, by one walk of the tree.
//!
//! A folded line is its frames' tokens in turn, each a folded name and
//! its separator (`;`, or ` ` before the weight when it is the last), and
//! no token is a prefix of another (a separator never appears in a folded
//! name): lines sort as their token sequences do, token by token. So a
//! node's children, each entered by a token (its name then `;`) and each
//! ending the paths that stop there by another (its name then ` `), list
//! their paths in order when those tokens are sorted, and a depth-first
//! walk lists every path in order. Paths that print alike (from several
//! threads, or through names that fold alike, `g h` and `g_h`) end at one
//! node, and so are one row.
//!
//! This replaced laying every path's frames end to end and sorting the
//! paths as sequences of token ranks, a name lookup per frame and a sort
//! comparing shared prefixes again and again. Here a name is looked up
//! once per node of a thread's own path trie, which already shares the
//! prefixes.

use crate::fx::FxMap;
use crate::{folded_name, StackRow};
use std::sync::Arc;

/// Node id of the empty path.
pub const ROOT: u32 = 0;

#[derive(Clone, Copy, Debug)]
struct Node {
    /// Its name (the first of those that print alike met here).
    name: u32,
    /// Whether a path ends here, with its samples and self time.
    ends: bool,
    samples: u64,
    self_ms: f64,
}

/// Call paths over a list of names, merged by printed name.
pub struct PathTree {
    nodes: Vec<Node>,
    /// (parent, canonical name) -> child.
    children: FxMap<(u32, u32), u32>,
    /// Each name's number among the names that print alike (that of the
    /// first such name), by name.
    canon: Vec<u32>,
    by_folded: FxMap<Box<[u8]>, u32>,
}

impl Default for PathTree {
    fn default() -> Self {
        PathTree {
            nodes: vec![Node {
                name: u32::MAX,
                ends: false,
                samples: 0,
                self_ms: 0.0,
            }],
            children: FxMap::default(),
            canon: Vec::new(),
            by_folded: FxMap::default(),
        }
    }
}

impl PathTree {
    /// Makes `name` known as name number `id`; names are numbered from 0 in
    /// turn, each before its first [`child`](Self::child).
    pub fn name(&mut self, id: u32, name: &str) {
        debug_assert_eq!(id as usize, self.canon.len(), "names are numbered in turn");
        let folded: Box<[u8]> = folded_name(name).collect();
        let canon = *self.by_folded.entry(folded).or_insert(id);
        self.canon.push(canon);
    }

    /// The node of `parent`'s path followed by frame `name`.
    pub fn child(&mut self, parent: u32, name: u32) -> u32 {
        let canon = self.canon[name as usize];
        let nodes = &mut self.nodes;
        *self.children.entry((parent, canon)).or_insert_with(|| {
            nodes.push(Node {
                name,
                ends: false,
                samples: 0,
                self_ms: 0.0,
            });
            (nodes.len() - 1) as u32
        })
    }

    /// The node of `frames`' path.
    #[cfg(test)]
    pub fn path(&mut self, frames: &[u32]) -> u32 {
        frames.iter().fold(ROOT, |node, &f| self.child(node, f))
    }

    /// Counts `samples` and `self_ms` to paths that end at `node`.
    pub fn end(&mut self, node: u32, samples: u64, self_ms: f64) {
        let n = &mut self.nodes[node as usize];
        n.ends = true;
        n.samples += samples;
        n.self_ms += self_ms;
    }

    /// Every path that ends somewhere, in the order of its folded line,
    /// frames as name numbers. `names` are the names numbered.
    pub fn rows(&self, names: &[Arc<str>]) -> Vec<StackRow> {
        let ranks = token_ranks(names);
        // Children by parent, laid out by parent (counting sort).
        let mut first = vec![0u32; self.nodes.len() + 1];
        for &(parent, _) in self.children.keys() {
            first[parent as usize + 1] += 1;
        }
        for i in 1..first.len() {
            first[i] += first[i - 1];
        }
        let mut at = first.clone();
        let mut kids = vec![0u32; self.children.len()];
        for (&(parent, _), &child) in &self.children {
            kids[at[parent as usize] as usize] = child;
            at[parent as usize] += 1;
        }
        let has_children = |n: u32| first[n as usize + 1] > first[n as usize];

        let mut out = Vec::new();
        let root = &self.nodes[ROOT as usize];
        if root.ends {
            out.push(StackRow {
                frames: Vec::new(),
                samples: root.samples,
                self_ms: root.self_ms,
            });
        }
        // Each node's entries (token, child, whether it ends the path)
        // sorted, on one stack; a frame of the walk is where its node's
        // entries start, the next one, and where they end.
        let mut entries: Vec<(u32, u32, bool)> = Vec::new();
        let mut walk: Vec<(usize, usize, usize)> = Vec::new();
        let mut path: Vec<u32> = Vec::new();
        let open = |node: u32, entries: &mut Vec<(u32, u32, bool)>| {
            let start = entries.len();
            for &c in &kids[first[node as usize] as usize..first[node as usize + 1] as usize] {
                let n = &self.nodes[c as usize];
                let rank = ranks[n.name as usize];
                if n.ends {
                    entries.push((rank[1], c, true));
                }
                if has_children(c) {
                    entries.push((rank[0], c, false));
                }
            }
            entries[start..].sort_unstable();
            (start, start, entries.len())
        };
        walk.push(open(ROOT, &mut entries));
        while let Some(top) = walk.last_mut() {
            if top.1 == top.2 {
                entries.truncate(top.0);
                walk.pop();
                if !walk.is_empty() {
                    path.pop();
                }
                continue;
            }
            let (_, c, ends) = entries[top.1];
            top.1 += 1;
            let n = &self.nodes[c as usize];
            path.push(n.name);
            if ends {
                out.push(StackRow {
                    frames: path.clone(),
                    samples: n.samples,
                    self_ms: n.self_ms,
                });
                path.pop();
            } else {
                let frame = open(c, &mut entries);
                walk.push(frame);
            }
        }
        out
    }
}

/// Each name's rank as a frame followed by more frames (`[0]`: the name
/// folded, then `;`) and as a path's last frame (`[1]`: then ` `), among
/// all these tokens as bytes; equal tokens share a rank.
fn token_ranks(names: &[Arc<str>]) -> Vec<[u32; 2]> {
    let mut tokens: Vec<(Vec<u8>, usize, usize)> = Vec::with_capacity(2 * names.len());
    for (i, name) in names.iter().enumerate() {
        for (last, sep) in [(0, b';'), (1, b' ')] {
            let mut t: Vec<u8> = folded_name(name).collect();
            t.push(sep);
            tokens.push((t, i, last));
        }
    }
    tokens.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    let mut ranks = vec![[0u32; 2]; names.len()];
    let mut rank = 0u32;
    for (j, (t, i, last)) in tokens.iter().enumerate() {
        if j > 0 && tokens[j - 1].0 != *t {
            rank += 1;
        }
        ranks[*i][*last] = rank;
    }
    ranks
}
