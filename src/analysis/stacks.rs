//! Stacks as tries: each distinct stack is a node, and stacks that share their outer frames
//! share the nodes of those frames, so a pass's memory grows with the distinct nodes, not
//! with stack length × stacks.
//!
//! [`StackTrie`] holds the location codes of a trace's backtraces, one code per node
//! (node [`ROOT`] is the empty stack). [`StackInterner`] builds it while reading: the reader
//! decodes each backtrace as the previous one of its domain cut to a common prefix, plus
//! new frames (FORMAT.md §7.6), so the interner keeps each domain's path of nodes and looks
//! up only the new frames. Work per allocation is therefore its new suffix, and a trace
//! whose every stack is one frame longer than the last costs linear time and memory.
//!
//! [`FrameTrie`] is the same structure over frames ([`FrameId`]s), for the views that work
//! on frames: a code with inlined calls expands to several nodes, and the derived stacks of
//! allocation sites (trimmed, or reduced to their spans) are interned in one.

use crate::format::hash::FastMap;
use crate::format::trace::Alloc;

use super::pass::FrameId;

/// A node of a [`StackTrie`] or [`FrameTrie`]: the stack from the outermost frame down to
/// this node's.
pub type NodeId = u32;

/// The empty stack, parent of the outermost frames.
pub const ROOT: NodeId = 0;

/// A trie whose nodes each add one item (a location code, or a frame) to their parent's
/// stack. Nodes are numbered in order of creation, so a parent's number is below its
/// children's.
#[derive(Debug, Clone)]
pub struct Trie<T> {
    /// Each node's parent (the root's is itself) and item (the root's is unused).
    nodes: Vec<(NodeId, T)>,
    children: FastMap<(NodeId, T), NodeId>,
}

impl<T: Copy + Default + Eq + std::hash::Hash> Default for Trie<T> {
    fn default() -> Trie<T> {
        Trie { nodes: vec![(ROOT, T::default())], children: FastMap::default() }
    }
}

impl<T: Copy + Default + Eq + std::hash::Hash> Trie<T> {
    /// Number of nodes, the root included.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Always false: the root is a node.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The parent of `node` (the root's is the root).
    pub fn parent(&self, node: NodeId) -> NodeId {
        self.nodes[node as usize].0
    }

    /// The item `node` adds to its parent's stack (unused for the root).
    pub fn item(&self, node: NodeId) -> T {
        self.nodes[node as usize].1
    }

    /// The node of `parent`'s stack with `item` added at its inner end.
    pub fn child(&mut self, parent: NodeId, item: T) -> NodeId {
        let next = self.nodes.len() as NodeId;
        let node = *self.children.entry((parent, item)).or_insert(next);
        if node == next {
            self.nodes.push((parent, item));
        }
        node
    }

    /// The items from `node` up to the root, innermost first.
    pub fn up(&self, mut node: NodeId) -> impl Iterator<Item = T> + Clone + '_ {
        std::iter::from_fn(move || {
            (node != ROOT).then(|| {
                let (parent, item) = self.nodes[node as usize];
                node = parent;
                item
            })
        })
    }
}

/// The distinct backtraces of a trace as a trie of location codes.
pub type StackTrie = Trie<u64>;

impl StackTrie {
    /// The codes of `node`'s stack, outermost first, as the trace stores them.
    pub fn codes(&self, node: NodeId) -> Vec<u64> {
        let mut codes: Vec<u64> = self.up(node).collect();
        codes.reverse();
        codes
    }
}

/// Builds a [`StackTrie`] from the allocations of a trace, in the order the reader returns
/// them (every allocation, so that each domain's path follows the reader's).
#[derive(Debug, Default)]
pub struct StackInterner {
    trie: StackTrie,
    /// Per domain, the nodes of its previous backtrace, outermost first.
    paths: Vec<(u16, Vec<NodeId>)>,
}

impl StackInterner {
    /// The node of `alloc`'s backtrace, recorded by `domain`.
    pub fn intern(&mut self, domain: u16, alloc: &Alloc<'_>) -> NodeId {
        let at = match self.paths.iter().position(|(d, _)| *d == domain) {
            Some(at) => at,
            None => {
                self.paths.push((domain, Vec::new()));
                self.paths.len() - 1
            }
        };
        let path = &mut self.paths[at].1;
        // The reader keeps the first `common_prefix` frames of the domain's previous
        // backtrace, or all of it when it is shorter (FORMAT.md §7.7).
        let kept =
            usize::try_from(alloc.common_prefix).unwrap_or(usize::MAX).min(path.len()).min(alloc.backtrace.len());
        path.truncate(kept);
        let mut node = path.last().copied().unwrap_or(ROOT);
        for &code in &alloc.backtrace[kept..] {
            node = self.trie.child(node, code);
            path.push(node);
        }
        node
    }

    /// The trie read so far.
    pub fn trie(&self) -> &StackTrie {
        &self.trie
    }

    /// The trie, once every allocation is interned.
    pub fn finish(self) -> StackTrie {
        self.trie
    }
}

/// Stacks of frames as a trie.
pub type FrameTrie = Trie<FrameId>;

/// The order of the nodes of a [`FrameTrie`] by their frames' labels
/// ([`FrameTrie::label_order`]).
#[derive(Debug)]
pub struct LabelOrder<'a> {
    trie: &'a FrameTrie,
    /// Each frame's label's rank among the labels.
    label_rank: Vec<u32>,
    /// Each node's rank, when comparing frame by frame would cost too much.
    ranks: Option<Vec<u32>>,
}

impl LabelOrder<'_> {
    /// The order of nodes `a` and `b`.
    pub fn cmp(&self, a: NodeId, b: NodeId) -> std::cmp::Ordering {
        match &self.ranks {
            Some(rank) => rank[a as usize].cmp(&rank[b as usize]),
            None => {
                let labels = |n| self.trie.up(n).map(|f| self.label_rank[f]);
                labels(a).cmp(labels(b))
            }
        }
    }
}

impl FrameTrie {
    /// The order of nodes by the `labels` of their frames, innermost first (a stack before
    /// the longer ones it starts; equal labels are equal), for sorting `count` nodes. Where
    /// comparing frame by frame could cost more than a few passes over the trie (deep
    /// stacks), nodes are ranked first ([`LabelOrder`]).
    pub fn label_order(&self, labels: &[String], count: usize) -> LabelOrder<'_> {
        let mut by_label: Vec<FrameId> = (0..labels.len()).collect();
        by_label.sort_by(|&a, &b| labels[a].cmp(&labels[b]));
        let mut label_rank = vec![0u32; labels.len()];
        for pair in by_label.windows(2) {
            label_rank[pair[1]] = label_rank[pair[0]] + u32::from(labels[pair[0]] != labels[pair[1]]);
        }
        let mut depth = vec![0u32; self.len()];
        for n in 1..self.len() {
            depth[n] = depth[self.parent(n as NodeId) as usize] + 1;
        }
        let deepest = depth.iter().max().copied().unwrap_or(0) as usize;
        let comparisons = count.saturating_mul(count.max(2).ilog2() as usize + 1);
        let walks = comparisons.saturating_mul(deepest) <= (1 << 24).max(16 * self.len());
        let ranks = (!walks).then(|| self.ranks(&label_rank));
        LabelOrder { trie: self, label_rank, ranks }
    }

    /// Each node's rank in the order of [`FrameTrie::label_order`], by prefix doubling:
    /// after round `k` nodes are ordered by their first `2^k` labels, from the ranks of each
    /// node and of its ancestor `2^(k-1)` frames out; so deep stacks cost `log(depth)`
    /// sorts, not a comparison of whole stacks per pair.
    fn ranks(&self, label_rank: &[u32]) -> Vec<u32> {
        let nodes = self.len();
        // Rank 0 is the root's: the end of a stack, before any label.
        let mut rank: Vec<u32> =
            (0..nodes as NodeId).map(|n| if n == ROOT { 0 } else { label_rank[self.item(n)] + 1 }).collect();
        let mut ancestor: Vec<NodeId> = (0..nodes as NodeId).map(|n| self.parent(n)).collect();
        let mut keyed: Vec<(u64, NodeId)> = Vec::with_capacity(nodes);
        loop {
            keyed.clear();
            keyed.extend((0..nodes).map(|n| {
                let key = (u64::from(rank[n]) << 32) | u64::from(rank[ancestor[n] as usize]);
                (key, n as NodeId)
            }));
            keyed.sort_unstable();
            let mut next = vec![0u32; nodes];
            let mut distinct = 1;
            for pair in keyed.windows(2) {
                let changed = pair[0].0 != pair[1].0;
                distinct += usize::from(changed);
                next[pair[1].1 as usize] = next[pair[0].1 as usize] + u32::from(changed);
            }
            let settled = ancestor.iter().all(|&a| a == ROOT);
            rank = next;
            if settled || distinct == nodes {
                return rank;
            }
            ancestor = ancestor.iter().map(|&a| ancestor[a as usize]).collect();
        }
    }

    /// The node of `parent`'s stack with `frames` (outermost first) added at its inner end:
    /// how a [`StackTrie`] node's code expands into its (inlined) frames.
    pub fn extend(&mut self, parent: NodeId, frames: &[FrameId]) -> NodeId {
        frames.iter().fold(parent, |node, &f| self.child(node, f))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::trace::AllocSource;

    fn alloc(common_prefix: u64, backtrace: &[u64]) -> Alloc<'_> {
        Alloc { id: 0, length: 1, nsamples: 1, source: AllocSource::External, common_prefix, backtrace }
    }

    #[test]
    fn shared_prefixes_share_nodes_and_domains_keep_their_own_path() {
        let mut s = StackInterner::default();
        let a = s.intern(0, &alloc(0, &[1, 2, 3]));
        let b = s.intern(0, &alloc(2, &[1, 2, 4]));
        let c = s.intern(1, &alloc(0, &[1, 2, 3]));
        // Domain 1's previous stack is [1, 2, 3], domain 0's [1, 2, 4].
        let d = s.intern(0, &alloc(3, &[1, 2, 4]));
        let e = s.intern(1, &alloc(1, &[1, 5]));
        let empty = s.intern(0, &alloc(0, &[]));
        let t = s.finish();
        assert_eq!((a, c, b, d, empty), (3, 3, 4, 4, ROOT));
        assert_eq!(t.len(), 6);
        assert_eq!(t.codes(e), [1, 5]);
        assert_eq!(t.up(b).collect::<Vec<_>>(), [4, 2, 1]);
    }

    #[test]
    fn frames_expand_codes_in_order() {
        let mut s = StackInterner::default();
        let a = s.intern(0, &alloc(0, &[10, 20]));
        let b = s.intern(0, &alloc(1, &[10, 30]));
        let stacks = s.finish();
        let mut frames = FrameTrie::default();
        let inlined: [(u64, &[FrameId]); 3] = [(10, &[0, 1]), (20, &[2]), (30, &[])];
        let mut node_of = vec![ROOT];
        for node in 1..stacks.len() as NodeId {
            let code = stacks.item(node);
            let expanded = inlined.iter().find(|(c, _)| *c == code).unwrap().1;
            node_of.push(frames.extend(node_of[stacks.parent(node) as usize], expanded));
        }
        assert_eq!(frames.up(node_of[a as usize]).collect::<Vec<_>>(), [2, 1, 0]);
        assert_eq!(frames.up(node_of[b as usize]).collect::<Vec<_>>(), [1, 0]);
        assert_eq!(frames.len(), 4);
    }

    #[test]
    fn order_by_labels_is_the_order_of_whole_stacks() {
        // Labels with repeats, so that stacks of different frames tie.
        let labels: Vec<String> = ["b", "a", "c", "a", "b"].iter().map(|s| s.to_string()).collect();
        let mut trie = FrameTrie::default();
        let mut state = 7u64;
        let mut nodes = vec![ROOT];
        for _ in 0..400 {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let parent = nodes[(state >> 33) as usize % nodes.len()];
            nodes.push(trie.child(parent, (state >> 20) as usize % labels.len()));
        }
        // Few nodes to sort are compared frame by frame, many are ranked first.
        for count in [10, 1 << 24] {
            let order = trie.label_order(&labels, count);
            assert_eq!(order.ranks.is_some(), count > 10);
            let names = |n: NodeId| trie.up(n).map(|f| labels[f].as_str()).collect::<Vec<_>>();
            for a in 0..trie.len() as NodeId {
                for b in 0..trie.len() as NodeId {
                    assert_eq!(order.cmp(a, b), names(a).cmp(&names(b)), "{a} {b}");
                }
            }
        }
    }
}
