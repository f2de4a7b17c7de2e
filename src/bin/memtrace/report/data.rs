//! The data a report page embeds: one trace's sampled blocks ([`memtrace_rs::analysis::blocks`]) as gzipped integer
//! columns, its stacks as a trie of frames, and its summary, in one JSON document.
//!
//! Schema (`report.js` decodes it):
//!
//! ```text
//! { version: 1, limit, top, keep: {allocator, root}, cli,
//!   frames: { strings: [..], fn: [string id], file: [string id], label: [string id], line: [..], alloc: [0|1], root: [0|1],
//!             pseudo: [0|1], body_of: [string id of the function whose closure it is, or −1], thread: [0|1] },
//!   traces: [ A ] or [ A (base), B (new) ], each
//!    { name, info: {start_us, rate, word_size, executable, host, runtime, context, pid},
//!      duration_us, tick_us, truncated, events, warnings: [..],
//!      peak: {t, bytes},                     // blocks::PeakFinder, of every sample
//!      nodes: { parent: [..], frame: [..] }, // trie; node 0 is the empty stack (parent −1)
//!      nblocks, thinned: null | {blocks, samples, keep},
//!      cols: base64(gzip(u32 LE columns of nblocks each)) } }
//! ```
//!
//! `cli` is the `memtrace hotspots TRACE …` command of the page's own settings (`--span`,
//! `--full-names`), to which the page adds the flags of its filter bar: the command whose
//! figures are the page's.
//!
//! The columns: alloc time as the delta from the previous block's (blocks are sorted by
//! alloc time) in ticks of `tick_us` (1 µs unless the trace is longer than 71 minutes);
//! lifetime + 1 in ticks, 0 if never freed; samples; words; stack node. The frame table is
//! shared by the traces of a diff, so a frame id is the match key
//! ([`FrameTable::match_by_identity`]).
//!
//! # Beyond the limit: thinning
//!
//! A trace with more than `limit` sampled blocks is thinned: each sample is kept with
//! probability `keep` (deterministically, from a hash of the block's position), blocks
//! left with no sample are dropped, and `info.rate` becomes `rate × keep`. The result is
//! a trace as the program would have given at that lower rate: every block keeps its
//! exact times, size and stack, so every clause of the filter stays exact, and the
//! estimates stay unbiased, with 95 % intervals (from the kept samples) that include the
//! thinning. Merging blocks instead would keep totals exact but not lifetimes or live
//! curves: blocks that live shorter than the merge's time quantum either pile up into
//! spikes or vanish. The peak is that of every sample, before thinning.

use std::io::{self, Read, Write};

use serde_json::{json, Value};

use memtrace_rs::analysis::blocks::{self, Block};
use memtrace_rs::analysis::filter::Filter;
use memtrace_rs::analysis::stacks::{FrameTrie, NodeId, ROOT};
use memtrace_rs::analysis::{
    enclosing_function, inert, inert_bytes, is_allocator_frame, is_root_frame, FrameKind, FrameTable, Origin,
};
use memtrace_rs::trace::{Info, Reader, Warning};
use memtrace_rs::Result;

/// How a trace was thinned to fit the limit (see the [module documentation](self)).
#[derive(Debug, Clone, Copy)]
pub struct Thinning {
    /// Sampled blocks in the trace.
    pub blocks: usize,
    /// Their samples.
    pub samples: u64,
    /// The probability with which each sample was kept.
    pub keep: f64,
}

/// One trace, ready to embed.
#[derive(Debug)]
pub struct TraceData {
    /// The name shown (the file's).
    pub name: String,
    /// The trace's metadata.
    pub info: Info,
    /// What the stream saw: end time, events, peak.
    pub summary: blocks::Stacks,
    /// What the reader skipped.
    pub warnings: Vec<Warning>,
    /// Stack trie: the parent of each node (`u32::MAX` for node 0, the empty stack).
    pub parent: Vec<u32>,
    /// The frame of each node (`u32::MAX` for node 0).
    pub frame: Vec<u32>,
    /// The blocks, sorted by alloc time, whose `stack` is a trie node.
    pub blocks: Vec<Block>,
    /// How the blocks were thinned, if they were.
    pub thinned: Option<Thinning>,
    /// The sample points the tracer lost, as the trace records them (`Analysis::lost`), and
    /// all its samples.
    pub lost_samples: u64,
    pub all_samples: u64,
    /// Whether the trace's writer closed it (`Reader::closed_by_writer`).
    pub closed_by_writer: bool,
}

impl TraceData {
    /// Give the trie's frames their new ids after the frame table merged some
    /// ([`FrameTable::shorten_names`], [`FrameTable::match_by_identity`]).
    pub fn remap_frames(&mut self, remap: &[usize]) {
        for f in self.frame.iter_mut().filter(|f| **f != u32::MAX) {
            *f = remap[*f as usize] as u32;
        }
    }

    /// Whether the trace comes from this crate's allocator (see `Analysis::origin`).
    pub fn is_rust(&self) -> bool {
        Origin::of(&self.info, self.summary.ocaml_events, self.summary.external_allocs) == Origin::Rust
    }

    /// Stream `reader` (the trace called `name`), interning frames into `frames`; keep
    /// only the blocks allocated inside `span` if given ([`Frame::is_span`]); thin the
    /// samples when there are more than `limit` blocks. `progress` is called with the
    /// bytes read now and then.
    ///
    /// [`Frame::is_span`]: memtrace_rs::analysis::Frame::is_span
    pub fn load<R: Read>(
        mut reader: Reader<R>,
        name: &str,
        frames: &mut FrameTable,
        limit: usize,
        span: Option<&str>,
        progress: impl FnMut(u64),
    ) -> Result<TraceData> {
        let mut blocks = Vec::new();
        let summary = blocks::stream(&mut reader, |block| blocks.push(*block), progress)?;
        // Frames hold inert names: a span matches given as shown or with its raw characters.
        let span = span.map(inert);
        let span = span.as_deref();
        // The trie of frames: each node of the stream's trie of codes becomes the node of
        // its code's last frame. Parents come before their children.
        let stacks = &summary.trie;
        let mut trie = FrameTrie::default();
        let (mut node_of, mut inside) = (vec![ROOT], vec![false]);
        for node in 1..stacks.len() as NodeId {
            let up = stacks.parent(node) as usize;
            let ids = frames.of_code(stacks.item(node), reader.locations()).to_vec();
            inside.push(inside[up] || span.is_some_and(|span| ids.iter().any(|&f| frames.frames[f].is_span(span))));
            node_of.push(trie.extend(node_of[up], &ids));
        }
        if span.is_some() {
            blocks.retain(|b| inside[b.stack as usize]);
        }
        let parent: Vec<u32> =
            (0..trie.len() as NodeId).map(|n| if n == ROOT { u32::MAX } else { trie.parent(n) }).collect();
        let frame = (0..trie.len() as NodeId).map(|n| if n == ROOT { u32::MAX } else { trie.item(n) as u32 }).collect();
        for b in &mut blocks {
            b.stack = node_of[b.stack as usize];
        }
        blocks.sort_by_key(|b| b.alloc_us);
        // The records of lost samples: one frame, at a location of the tracer's loss file.
        let lost = |b: &&Block| {
            parent.get(b.stack as usize) == Some(&ROOT) && frames.frames[trie.item(b.stack)].records_lost_samples()
        };
        let lost_samples = blocks.iter().filter(lost).fold(0u64, |sum, b| sum.saturating_add(b.nsamples));
        let all_samples = blocks.iter().fold(0u64, |sum, b| sum.saturating_add(b.nsamples));
        let mut data = TraceData {
            name: name.to_string(),
            info: reader.info().clone(),
            summary,
            warnings: reader.warnings().to_vec(),
            parent,
            frame,
            blocks,
            thinned: None,
            lost_samples,
            all_samples,
            closed_by_writer: reader.closed_by_writer(),
        };
        if data.blocks.len() > limit {
            data.thin(limit);
        }
        Ok(data)
    }

    /// Keep each sample with the probability that leaves at most `limit` blocks (see the
    /// [module documentation](self)).
    fn thin(&mut self, limit: usize) {
        let samples = self.blocks.iter().fold(0u64, |sum, b| sum.saturating_add(b.nsamples));
        // Keeping `keep × samples ≤ limit` samples expects at most `limit` blocks.
        let mut keep = (limit as f64 / samples.max(1) as f64).min(1.0);
        loop {
            let kept: Vec<Block> = self
                .blocks
                .iter()
                .enumerate()
                .filter_map(|(i, b)| {
                    let nsamples = thinned(b.nsamples, keep, i as u64);
                    (nsamples > 0).then_some(Block { nsamples, ..*b })
                })
                .collect();
            if kept.len() <= limit {
                self.thinned = Some(Thinning { blocks: self.blocks.len(), samples, keep });
                self.blocks = kept;
                return;
            }
            keep *= 0.95;
        }
    }

    /// The block columns (see the [module documentation](self)), gzipped.
    fn columns(&self, tick: u64) -> Vec<u8> {
        let u32_of = |x: u64| x.min(u64::from(u32::MAX)) as u32;
        let mut raw: Vec<u8> = Vec::with_capacity(self.blocks.len() * 24);
        let mut previous = 0;
        for b in &self.blocks {
            let at = b.alloc_us / tick;
            raw.extend_from_slice(&u32_of(at - previous).to_le_bytes());
            previous = at;
        }
        for b in &self.blocks {
            let life = b.free_us.map_or(0, |f| u32_of(f / tick - b.alloc_us / tick + 1));
            raw.extend_from_slice(&life.to_le_bytes());
        }
        for column in [|b: &Block| b.nsamples, |b: &Block| b.words, |b: &Block| u64::from(b.stack)] {
            for b in &self.blocks {
                raw.extend_from_slice(&u32_of(column(b)).to_le_bytes());
            }
        }
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(6));
        gz.write_all(&raw).and_then(|()| gz.finish()).expect("gzip in memory cannot fail")
    }

    fn to_json(&self) -> Value {
        let tick = self.summary.end_us / u64::from(u32::MAX - 1) + 1;
        let text = |b: &[u8]| inert_bytes(b).into_owned();
        let signed = |v: &[u32]| v.iter().map(|&x| if x == u32::MAX { -1 } else { i64::from(x) }).collect::<Vec<_>>();
        let info = &self.info;
        let keep = self.thinned.map_or(1.0, |t| t.keep);
        json!({
            "name": self.name,
            "info": {
                "start_us": info.start_time, "rate": info.sample_rate * keep, "word_size": info.word_size,
                "executable": text(&info.executable_name), "host": text(&info.host_name),
                "runtime": text(&info.runtime_params), "context": info.context.as_deref().map(text).unwrap_or_default(),
                "pid": info.pid,
            },
            "duration_us": self.summary.end_us, "tick_us": tick, "truncated": self.warnings.iter().any(|w| matches!(w, Warning::TruncatedPacket { .. })),
            "events": self.summary.events, "warnings": self.warnings.iter().map(|w| w.to_string()).collect::<Vec<_>>(),
            "peak": { "t": self.summary.peak_us, "bytes": super::super::json::whole(info.bytes_for_samples(self.summary.peak_samples)) },
            "nodes": { "parent": signed(&self.parent), "frame": signed(&self.frame) },
            "nblocks": self.blocks.len(),
            "thinned": self.thinned.map(|t| json!({ "blocks": t.blocks, "samples": t.samples, "keep": t.keep })),
            "cols": super::base64(&self.columns(tick)),
        })
    }
}

/// How many of `nsamples` samples are kept when each is kept with probability `keep`: a
/// binomial draw, from a SplitMix64 sequence seeded by `key` so that a report is
/// reproducible (a random-number crate would bring more than these few lines). Above 64
/// samples the expected number is kept, its fraction drawn once.
fn thinned(nsamples: u64, keep: f64, key: u64) -> u64 {
    let mut state = key.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let mut uniform = || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)) as f64 / 2f64.powi(64)
    };
    if nsamples <= 64 {
        (0..nsamples).filter(|_| uniform() < keep).count() as u64
    } else {
        let expected = nsamples as f64 * keep;
        expected.floor() as u64 + u64::from(uniform() < expected.fract())
    }
}

/// Write the JSON document for `traces` (one, or base and new) with the frame table
/// `frames` and the page's settings from `options`. No `<` occurs in it, so it can sit inside a `<script>` element.
pub fn write_json(
    frames: &FrameTable,
    traces: &[TraceData],
    options: &super::Options,
    out: &mut impl Write,
) -> io::Result<()> {
    let list = &frames.frames;
    // The page shows `hotspots`' labels (`Frame::label`: span and thread frames their own way).
    let labels: Vec<String> = list.iter().map(|f| f.label()).collect();
    let (mut strings, mut ids) = (Vec::new(), std::collections::HashMap::new());
    let mut intern = |all: &mut Vec<usize>, s| all.push(intern_in(&mut strings, &mut ids, s));
    let (mut functions, mut files, mut label_ids) = (Vec::new(), Vec::new(), Vec::new());
    for (frame, label) in list.iter().zip(&labels) {
        intern(&mut functions, frame.function.as_str());
        intern(&mut files, frame.file.as_str());
        intern(&mut label_ids, label.as_str());
    }
    // The page trims a hand-off to a runtime as `Trim::kept` does: it compares a closure's
    // enclosing function with the function of an outer frame.
    let body_of: Vec<i64> = list
        .iter()
        .map(|f| match enclosing_function(&f.function) {
            Some(outer) => intern_in(&mut strings, &mut ids, outer) as i64,
            None => -1,
        })
        .collect();
    let doc = json!({
        "version": 1, "limit": options.limit, "top": options.top,
        "keep": { "allocator": options.trim.keep_allocator_frames, "root": options.trim.keep_root_frames },
        "cli": hotspots_command(options),
        "frames": {
            "strings": strings, "fn": functions, "file": files, "label": label_ids,
            "line": list.iter().map(|f| f.line).collect::<Vec<_>>(),
            "alloc": list.iter().map(|f| u8::from(is_allocator_frame(&f.function, &f.file))).collect::<Vec<_>>(),
            "root": list.iter().map(|f| u8::from(f.kind() == FrameKind::Code && is_root_frame(&f.function, &f.file))).collect::<Vec<_>>(),
            "pseudo": list.iter().map(|f| u8::from(f.kind() != FrameKind::Code)).collect::<Vec<_>>(),
            "body_of": body_of,
            "thread": list.iter().map(|f| u8::from(f.kind() == FrameKind::Thread)).collect::<Vec<_>>(),
        },
        "traces": traces.iter().map(TraceData::to_json).collect::<Vec<_>>(),
    });
    // Outside strings JSON has no `<`, so escaping every one keeps `</script` and `<!--` out.
    out.write_all(serde_json::to_string(&doc)?.replace('<', "\\u003c").as_bytes())
}

/// `memtrace hotspots TRACE` with the flags that give the figures of the page `options` ask
/// for, before its filter bar adds its own: `--span` (as the frames hold it, inert) and
/// `--full-names`.
fn hotspots_command(options: &super::Options) -> String {
    let span = Filter { span: options.span.as_deref().map(|s| inert(s).into_owned()), ..Filter::default() };
    let mut words = vec!["memtrace hotspots TRACE".to_string()];
    words.extend((!span.is_empty()).then(|| span.to_string()));
    words.extend(options.names.full_names.then(|| "--full-names".to_string()));
    words.join(" ")
}

/// The index of `s` in `strings`, added the first time.
fn intern_in<'s>(strings: &mut Vec<&'s str>, ids: &mut std::collections::HashMap<&'s str, usize>, s: &'s str) -> usize {
    *ids.entry(s).or_insert_with(|| {
        strings.push(s);
        strings.len() - 1
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thinning_keeps_the_expected_share_reproducibly() {
        let kept: u64 = (0..100_000).map(|key| thinned(2, 0.1, key)).sum();
        assert!((19_000..21_000).contains(&kept), "{kept} of 200000 samples kept at 0.1");
        assert_eq!(thinned(2, 0.1, 7), thinned(2, 0.1, 7));
        assert_eq!(thinned(5, 1.0, 3), 5);
        let big: u64 = (0..1000).map(|key| thinned(1000, 0.25, key)).sum();
        assert_eq!(big, 250_000);
    }
}
