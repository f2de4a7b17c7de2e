//! Allocation sites: grouping the stacks of an [`Analysis`] by the frame that allocated.
//!
//! A site is the innermost frame outside the allocator machinery ([`is_allocator_frame`]:
//! the standard library's allocation and collections, hashbrown, this crate's allocator
//! and the unwinder); whole stacks also lose the runtime's start-up frames at their outer
//! end ([`is_root_frame`]), below the span and thread frames of this crate's runtime, which
//! stay outermost. Allocator frames are trimmed
//! from the inner end only, so a program's closure called from `core` is still a site. With
//! [`Grouping::stacks`] a site is the whole stack with those frames trimmed. OCaml traces
//! never match these patterns, so their site is simply the innermost frame. Grouped by span
//! or thread ([`Grouping::kind`]), a stack keeps only the frames of that kind instead of
//! being trimmed: a site is its innermost span (all its spans with `stacks`) or its thread.

use std::collections::HashMap;
use std::ops::Range;

use super::pass::{Analysis, FrameId, FrameKind, Measure, StackStats};
use crate::frames::{is_allocator_frame, is_root_frame};

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
    /// The range of `frames` (innermost first) that is kept.
    pub fn kept(self, analysis: &Analysis, frames: &[FrameId]) -> Range<usize> {
        let frame = |i: usize| &analysis.frames[frames[i]];
        let mut start = 0;
        if !self.keep_allocator_frames {
            start = (0..frames.len()).find(|&i| !is_allocator_frame(&frame(i).function, &frame(i).file)).unwrap_or(0);
        }
        let mut end = frames.len();
        if !self.keep_root_frames {
            if let Some(last) = (start..end).rev().find(|&i| !is_root_frame(&frame(i).function, &frame(i).file)) {
                end = last + 1;
            }
        }
        start..end
    }
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

    /// The labels of the site's frames, innermost first (the site's [`label`](Site::label)
    /// when it has none).
    pub fn labels(&self, analysis: &Analysis) -> Vec<String> {
        if self.frames.is_empty() {
            return vec![self.label(analysis)];
        }
        self.frames.iter().map(|&f| analysis.frames[f].label()).collect()
    }

    /// A key that identifies the site across traces: the labels of all its frames.
    pub fn key(&self, analysis: &Analysis) -> String {
        self.labels(analysis).join(" <- ")
    }
}

/// Group the stacks of `analysis` into sites, ranked by `measure` (largest first; ties by
/// label). Sites whose figure for `measure` is zero are left out.
pub fn ranked(analysis: &Analysis, grouping: Grouping, measure: Measure) -> Vec<Site> {
    let mut by_frames: HashMap<Vec<FrameId>, StackStats> = HashMap::new();
    for stack in &analysis.stacks {
        let mut frames: Vec<FrameId> = analysis.stack_frames(stack).rev().collect();
        if grouping.kind == FrameKind::Code {
            // The runtime's span and thread frames are the outermost: the code below them
            // is trimmed, and they stay above it in whole stacks (a site is code only).
            let code = frames.iter().rposition(|&f| analysis.frames[f].kind() == FrameKind::Code).map_or(0, |i| i + 1);
            let pseudo = frames.split_off(code);
            let kept = grouping.trim.kept(analysis, &frames);
            frames.truncate(kept.end);
            frames.drain(..kept.start);
            if grouping.stacks {
                frames.extend(pseudo);
            }
        } else {
            frames.retain(|&f| analysis.frames[f].kind() == grouping.kind);
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
