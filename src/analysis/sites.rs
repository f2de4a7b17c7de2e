//! Allocation sites: grouping the stacks of an [`Analysis`] by the frame that allocated.
//!
//! A site is the innermost frame outside the allocator machinery ([`is_allocator_frame`]:
//! the standard library's allocation and collections, hashbrown, this crate's allocator
//! and the unwinder). Frames are trimmed
//! from the inner end only, so a program's closure called from `core` is still a site. With
//! [`Grouping::stacks`] a site is the whole stack with those frames trimmed. OCaml traces
//! never match these patterns, so their site is simply the innermost frame. Grouped by span
//! or thread ([`Grouping::kind`]), a site is the innermost span (all the spans with
//! `stacks`) or the thread of each stack instead.

use std::collections::HashMap;

use super::pass::{Analysis, FrameId, FrameKind, Measure, StackStats};
use crate::frames::is_allocator_frame;

/// How stacks are grouped into sites.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Grouping {
    /// What a site is made of: code frames (the default), or the stack's spans or its thread
    /// (a site is then the innermost span, or the thread; with `stacks`, all the spans).
    pub kind: FrameKind,
    /// A site is the whole stack (trimmed) rather than its innermost frame.
    pub stacks: bool,
    /// Allocator frames are kept instead of trimmed from the inner end of each stack: a
    /// site is then the innermost frame whatever it is.
    pub keep_allocator_frames: bool,
}

/// A group of stacks sharing a site.
#[derive(Debug, Clone)]
pub struct Site {
    /// The site's frames, innermost first: one frame, or a whole trimmed stack; empty for
    /// allocations without a backtrace (or without a frame of the grouping's kind).
    pub frames: Vec<FrameId>,
    /// The kind of frames the site was grouped by.
    pub kind: FrameKind,
    /// The summed figures of the site's stacks.
    pub stats: StackStats,
}

impl Site {
    /// The site's name: its innermost frame's label (`(no backtrace)`, `(no span)` or
    /// `(no thread)` when it has none).
    pub fn label(&self, analysis: &Analysis) -> String {
        let none = match self.kind {
            FrameKind::Code => "(no backtrace)",
            FrameKind::Span => "(no span)",
            FrameKind::Thread => "(no thread)",
        };
        self.frames.first().map_or_else(|| none.to_string(), |&f| analysis.frames[f].label())
    }

    /// A key that identifies the site across traces: the labels of all its frames.
    pub fn key(&self, analysis: &Analysis) -> String {
        if self.frames.is_empty() {
            return self.label(analysis);
        }
        let labels: Vec<String> = self.frames.iter().map(|&f| analysis.frames[f].label()).collect();
        labels.join(" <- ")
    }
}

/// Group the stacks of `analysis` into sites, ranked by `measure` (largest first; ties by
/// label). Sites whose figure for `measure` is zero are left out.
pub fn ranked(analysis: &Analysis, grouping: Grouping, measure: Measure) -> Vec<Site> {
    let mut by_frames: HashMap<Vec<FrameId>, StackStats> = HashMap::new();
    for stack in &analysis.stacks {
        let mut frames: Vec<FrameId> = analysis.stack_frames(stack).rev().collect();
        if grouping.kind != FrameKind::Code {
            frames.retain(|&f| analysis.frames[f].kind() == grouping.kind);
        } else if !grouping.keep_allocator_frames {
            // Trim machinery from the inner end, unless the whole stack is machinery.
            if let Some(first) =
                frames.iter().position(|&f| !is_allocator_frame(&analysis.frames[f].function, &analysis.frames[f].file))
            {
                frames.drain(..first);
            }
        }
        if !grouping.stacks {
            frames.truncate(1);
        }
        by_frames.entry(frames).or_default().add(&stack.stats);
    }
    let labels: Vec<String> = analysis.frames.iter().map(|f| f.label()).collect();
    let mut sites: Vec<Site> = by_frames
        .into_iter()
        .map(|(frames, stats)| Site { frames, kind: grouping.kind, stats })
        .filter(|s| s.stats.get(measure).samples > 0)
        .collect();
    sites.sort_by(|a, b| {
        let names = |s: &Site| s.frames.iter().map(|&f| labels[f].as_str()).collect::<Vec<_>>();
        b.stats.get(measure).samples.cmp(&a.stats.get(measure).samples).then_with(|| names(a).cmp(&names(b)))
    });
    sites
}
