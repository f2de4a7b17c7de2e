//! Allocation sites: grouping the stacks of an [`Analysis`] by the frame that allocated.
//!
//! A site is the innermost frame outside the allocator machinery ([`is_allocator_frame`]:
//! the standard library's allocation and collections, hashbrown, this crate's allocator
//! and the unwinder); whole stacks also lose the runtime's start-up frames at their outer
//! end ([`is_root_frame`]), and a hand-off to a runtime just inside them
//! (`frames::hands_off_to_runtime`), below the span and thread frames of this crate's runtime,
//! which stay outermost. Allocator frames are trimmed from the inner end only, so a program's
//! closure called from `core` is still a site. With [`Grouping::stacks`] a site is the whole
//! stack with those frames trimmed. OCaml traces
//! never match these patterns, so their site is simply the innermost frame. Grouped by span
//! or thread ([`Grouping::kind`]), a stack keeps only the frames of that kind instead of
//! being trimmed: a site is its innermost span (all its spans with `stacks`) or its thread.

use std::sync::Arc;

use super::pass::{Analysis, Frame, FrameId, FrameKind, Measure, StackStats};
use super::stacks::{FrameTrie, NodeId, ROOT};
use crate::format::hash::FastMap;
use crate::frames::{hands_off_to_runtime, is_allocator_frame, is_root_frame, kept_frames};

/// How stacks are grouped into sites.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Grouping {
    /// What a site is made of: code frames (the default), or the stack's spans or its thread
    /// (only the frames of that kind are kept, and `trim` does not apply).
    pub kind: FrameKind,
    /// A site is the whole stack (trimmed) rather than its innermost frame.
    pub stacks: bool,
    /// Which frames are trimmed from the ends of each stack.
    pub trim: Trim,
}

/// Which frames are trimmed from the ends of stacks: by default the allocator machinery
/// from the inner end ([`is_allocator_frame`]) and the runtime's start-up frames from the
/// outer end ([`is_root_frame`]). A stack made only of such frames keeps them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Trim {
    /// Keep allocator frames: a site is then the innermost frame whatever it is.
    pub keep_allocator_frames: bool,
    /// Keep the frames that start the program and its threads (`_start`, `main`,
    /// `std::rt::lang_start`, thread-spawn closures, …).
    pub keep_root_frames: bool,
}

impl Trim {
    /// The indexes of the `frames` (innermost first) that are kept. Root frames are trimmed
    /// below the span and thread pseudo-frames at the outer end, which are kept, as
    /// [`ranked`] does.
    pub fn kept(self, analysis: &Analysis, frames: &[FrameId]) -> Vec<usize> {
        let frame = |i: usize| {
            let frame = &analysis.frames[frames[i]];
            (&frame.function[..], &frame.file[..])
        };
        kept_frames(frames.len(), self.keep_allocator_frames, self.keep_root_frames, frame).collect()
    }
}

/// A group of stacks sharing a site.
#[derive(Debug, Clone)]
pub struct Site {
    /// The kind of frames the site was grouped by.
    pub kind: FrameKind,
    /// The summed figures of the site's stacks.
    pub stats: StackStats,
    /// The site's frames: a node of the sites' trie, whose stack is one frame or a whole
    /// trimmed stack; the root for allocations without a backtrace (or without a frame of
    /// the grouping's kind).
    node: NodeId,
    trie: Arc<FrameTrie>,
}

impl Site {
    /// The site's frames, innermost first.
    pub fn frames(&self) -> impl Iterator<Item = FrameId> + Clone + '_ {
        self.trie.up(self.node)
    }

    /// Whether the site has no frame.
    pub fn is_empty(&self) -> bool {
        self.node == ROOT
    }

    /// The site's node in [`Site::trie`], shared by all the sites of one ranking.
    pub fn node(&self) -> NodeId {
        self.node
    }

    /// The trie of the sites' frames.
    pub fn trie(&self) -> &FrameTrie {
        &self.trie
    }

    /// The site's name: its innermost frame's label (`(no backtrace)`, `(no span)` or
    /// `(no thread)` when it has none).
    pub fn label(&self, analysis: &Analysis) -> String {
        let none = match self.kind {
            FrameKind::Code => "(no backtrace)",
            FrameKind::Span => "(no span)",
            FrameKind::Thread => "(no thread)",
        };
        self.frames().next().map_or_else(|| none.to_string(), |f| analysis.frames[f].label())
    }

    /// The labels of the site's frames, innermost first (the site's [`label`](Site::label)
    /// when it has none).
    pub fn labels(&self, analysis: &Analysis) -> Vec<String> {
        if self.is_empty() {
            return vec![self.label(analysis)];
        }
        self.frames().map(|f| analysis.frames[f].label()).collect()
    }

    /// A key that identifies the site across traces: the labels of all its frames.
    pub fn key(&self, analysis: &Analysis) -> String {
        self.labels(analysis).join(" <- ")
    }
}

/// What a walk from the outermost frame of a stack inwards knows of the stack's site (see
/// the [module documentation](self)); each code of the stack trie extends its parent's.
#[derive(Debug, Clone, Copy)]
struct Walk {
    /// Only pseudo-frames (spans, threads) so far.
    in_pseudo: bool,
    /// The node of the pseudo-frames.
    pseudo: NodeId,
    /// The node of the pseudo-frames and every code frame so far.
    all: NodeId,
    /// The same without the outermost root frames; `None` while every code frame is one.
    trimmed: Option<NodeId>,
    /// While the frames after the outermost kept one are root frames: that frame and how many
    /// there are (a hand-off to a runtime, [`hands_off_to_runtime`], if its body follows).
    hand_off: Option<(FrameId, usize)>,
    /// `all`, `trimmed` and the frame at the innermost frame so far that is not the
    /// allocator's.
    last_kept: Option<(NodeId, Option<NodeId>, FrameId)>,
    /// The innermost frame so far (for a kind other than code: of that kind).
    innermost: Option<FrameId>,
}

impl Walk {
    const START: Walk = Walk {
        in_pseudo: true,
        pseudo: ROOT,
        all: ROOT,
        trimmed: None,
        hand_off: None,
        last_kept: None,
        innermost: None,
    };
}

/// What [`ranked`] needs to know of each frame.
struct Rules<'a> {
    grouping: Grouping,
    frames: &'a [Frame],
    kind: Vec<FrameKind>,
    /// Trimmed from the inner end unless the allocator's frames are kept.
    allocator: Vec<bool>,
    /// Trimmed from the outer end unless the root frames are kept.
    root: Vec<bool>,
}

impl<'a> Rules<'a> {
    fn new(analysis: &'a Analysis, grouping: Grouping) -> Rules<'a> {
        let frames = &analysis.frames;
        Rules {
            grouping,
            frames,
            kind: frames.iter().map(Frame::kind).collect(),
            allocator: frames
                .iter()
                .map(|f| !grouping.trim.keep_allocator_frames && is_allocator_frame(&f.function, &f.file))
                .collect(),
            root: frames
                .iter()
                .map(|f| !grouping.trim.keep_root_frames && is_root_frame(&f.function, &f.file))
                .collect(),
        }
    }

    /// `walk` one frame further in, `f`, interning the stacks it needs in `sites`.
    fn step(&self, mut walk: Walk, f: FrameId, sites: &mut FrameTrie) -> Walk {
        let stacks = self.grouping.stacks;
        if self.grouping.kind != FrameKind::Code {
            if self.kind[f] == self.grouping.kind {
                walk.innermost = Some(f);
                if stacks {
                    walk.all = sites.child(walk.all, f);
                }
            }
            return walk;
        }
        if walk.in_pseudo && self.kind[f] != FrameKind::Code {
            if stacks {
                walk.pseudo = sites.child(walk.pseudo, f);
                walk.all = walk.pseudo;
            }
            return walk;
        }
        walk.in_pseudo = false;
        walk.innermost = Some(f);
        if stacks {
            walk.all = sites.child(walk.all, f);
            let (trimmed, hand_off) = match (walk.trimmed, walk.hand_off) {
                (Some(t), Some((outer, between))) if self.root[f] => {
                    (Some(sites.child(t, f)), Some((outer, between + 1)))
                }
                (Some(_), Some((outer, between)))
                    if hands_off_to_runtime(&self.frames[outer].function, &self.frames[f].function, between) =>
                {
                    (Some(sites.child(walk.pseudo, f)), None)
                }
                (Some(t), _) => (Some(sites.child(t, f)), None),
                (None, _) if !self.root[f] => (Some(sites.child(walk.pseudo, f)), Some((f, 0))),
                (None, _) => (None, None),
            };
            (walk.trimmed, walk.hand_off) = (trimmed, hand_off);
        }
        if !self.allocator[f] {
            walk.last_kept = Some((walk.all, walk.trimmed, f));
        }
        walk
    }

    /// The site of the stack `walk` ended at.
    fn site(&self, walk: &Walk, sites: &mut FrameTrie) -> NodeId {
        if self.grouping.kind != FrameKind::Code {
            return match (self.grouping.stacks, walk.innermost) {
                (true, _) => walk.all,
                (false, Some(f)) => sites.child(ROOT, f),
                (false, None) => ROOT,
            };
        }
        if walk.in_pseudo {
            return if self.grouping.stacks { walk.pseudo } else { ROOT };
        }
        // The innermost frame that is not the allocator's, or the innermost if all are;
        // then the outermost root frames are left out unless every kept frame is one.
        let (all, trimmed, frame) = walk.last_kept.unwrap_or((walk.all, walk.trimmed, walk.innermost.unwrap_or(0)));
        if self.grouping.stacks {
            trimmed.unwrap_or(all)
        } else {
            sites.child(ROOT, frame)
        }
    }
}

/// Group the stacks of `analysis` into sites, ranked by `measure` (largest first; ties by
/// label). Sites whose figure for `measure` is zero are left out. The work is linear in the
/// nodes of the stack trie: each node's site is its parent's walked one code further.
pub fn ranked(analysis: &Analysis, grouping: Grouping, measure: Measure) -> Vec<Site> {
    let rules = Rules::new(analysis, grouping);
    let mut trie = FrameTrie::default();
    let stacks = &analysis.trie;
    let mut walks = Vec::with_capacity(stacks.len());
    walks.push(Walk::START);
    for node in 1..stacks.len() as NodeId {
        let parent = walks[stacks.parent(node) as usize];
        let walk = analysis.frames_of(stacks.item(node)).iter().fold(parent, |w, &f| rules.step(w, f, &mut trie));
        walks.push(walk);
    }
    let mut by_node: FastMap<NodeId, StackStats> = FastMap::default();
    for stack in &analysis.stacks {
        let node = rules.site(&walks[stack.node as usize], &mut trie);
        by_node.entry(node).or_default().add(&stack.stats);
    }
    drop(walks);
    let labels: Vec<String> = analysis.frames.iter().map(|f| f.label()).collect();
    let mut sites: Vec<(NodeId, StackStats)> =
        by_node.into_iter().filter(|(_, stats)| stats.get(measure).samples > 0).collect();
    let order = trie.label_order(&labels, sites.len());
    sites.sort_by(|(a, x), (b, y)| y.get(measure).samples.cmp(&x.get(measure).samples).then_with(|| order.cmp(*a, *b)));
    drop(order);
    let trie = Arc::new(trie);
    sites.into_iter().map(|(node, stats)| Site { kind: grouping.kind, stats, node, trie: Arc::clone(&trie) }).collect()
}
