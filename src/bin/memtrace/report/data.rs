//! The data a report page embeds: one trace's sampled blocks ([`blocks`](memtrace_rs::analysis::blocks)) as gzipped integer
//! columns, its stacks as a trie of frames, and its summary, in one JSON document.
//!
//! Schema (`report.js` decodes it):
//!
//! ```text
//! { version: 1, limit, top,
//!   frames: { strings: [..], fn: [string id], file: [string id], line: [..], alloc: [0|1] },
//!   traces: [ A ] or [ A (base), B (new) ], each
//!    { name, info: {start_us, rate, word_size, executable, host, runtime, context, pid},
//!      duration_us, tick_us, truncated, events, warnings: [..],
//!      peak: {t, samples},                   // blocks::PeakFinder
//!      nodes: { parent: [..], frame: [..] }, // trie; node 0 is the empty stack (parent −1)
//!      nblocks, objects: bool, aggregated: null | {original_blocks, quantum_us},
//!      cols: base64(gzip(u32 LE columns of nblocks each)) } }
//! ```
//!
//! The columns: alloc time as the delta from the previous block's (blocks are sorted by
//! alloc time) in ticks of `tick_us` (1 µs unless the trace is longer than 71 minutes);
//! lifetime + 1 in ticks, 0 if never freed; samples; words; stack node; and, when
//! aggregated, the estimated objects (f32). The frame table is shared by the traces of a
//! diff, so a frame id is the match key (function, file, line).
//!
//! Above `limit` blocks, blocks with the same stack, power-of-two size class, alloc time
//! rounded down to a quantum and quarter-octave lifetime class are merged into one, the
//! quantum doubling until they fit: a group keeps its blocks' mean alloc time, mean
//! lifetime, mean size and summed samples, so short lifetimes stay short.

use std::io::{self, Read, Write};

use serde_json::{json, Value};

use memtrace_rs::analysis::blocks::{self, Block};
use memtrace_rs::analysis::{estimated_objects, is_allocator_frame, FrameTable};
use memtrace_rs::trace::{Info, Reader, Warning};
use memtrace_rs::Result;

/// How blocks were merged to fit the limit.
#[derive(Debug, Clone, Copy)]
pub struct Aggregation {
    /// Sampled blocks in the trace.
    pub original_blocks: usize,
    /// Alloc times were grouped by multiples of this (µs).
    pub quantum_us: u64,
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
    /// True when the file ended inside a packet.
    pub truncated: bool,
    /// Stack trie: the parent of each node (`u32::MAX` for node 0, the empty stack).
    pub parent: Vec<u32>,
    /// The frame of each node (`u32::MAX` for node 0).
    pub frame: Vec<u32>,
    /// The blocks, sorted by alloc time, whose `stack` is a trie node.
    pub blocks: Vec<Block>,
    /// Per block, the objects it stands for, when aggregated.
    pub objects: Option<Vec<f32>>,
    /// How blocks were merged, if they were.
    pub aggregated: Option<Aggregation>,
}

impl TraceData {
    /// Stream `reader` (the trace called `name`), interning frames into `frames`; merge
    /// blocks when there are more than `limit`.
    pub fn load<R: Read>(
        mut reader: Reader<R>,
        name: &str,
        frames: &mut FrameTable,
        limit: usize,
    ) -> Result<TraceData> {
        let mut blocks = Vec::new();
        let summary = blocks::stream(&mut reader, |block, _| blocks.push(*block))?;
        // The trie of stacks: each stream stack becomes the node of its last frame.
        let (mut parent, mut frame) = (vec![u32::MAX], vec![u32::MAX]);
        let mut children: std::collections::HashMap<(u32, u32), u32> = std::collections::HashMap::new();
        let node_of: Vec<u32> = summary
            .codes
            .iter()
            .map(|codes| {
                let mut node = 0;
                for &code in codes.iter() {
                    for &f in frames.of_code(code, reader.locations()) {
                        node = *children.entry((node, f as u32)).or_insert_with(|| {
                            parent.push(node);
                            frame.push(f as u32);
                            (parent.len() - 1) as u32
                        });
                    }
                }
                node
            })
            .collect();
        for b in &mut blocks {
            b.stack = node_of[b.stack as usize];
        }
        blocks.sort_by_key(|b| b.alloc_us);
        let mut data = TraceData {
            name: name.to_string(),
            info: reader.info().clone(),
            summary,
            warnings: reader.warnings().to_vec(),
            truncated: reader.is_truncated(),
            parent,
            frame,
            blocks,
            objects: None,
            aggregated: None,
        };
        if data.blocks.len() > limit {
            data.aggregate(limit);
        }
        Ok(data)
    }

    /// Merge blocks as the [module documentation](self) says until at most `limit` remain
    /// (or the quantum is the whole trace).
    fn aggregate(&mut self, limit: usize) {
        #[derive(Default)]
        struct Group {
            count: u64,
            alloc_sum: u128,
            life_sum: u128,
            words_sum: u128,
            samples: u64,
            objects: f64,
        }
        let duration = self.summary.end_us.max(1);
        let rate = self.info.sample_rate;
        let mut quantum = (duration / 4096).max(1).next_power_of_two();
        loop {
            let mut groups: std::collections::HashMap<(u32, u32, u64, u32), Group> = Default::default();
            for b in &self.blocks {
                let size_class = 64 - b.words.leading_zeros();
                // Quarter octaves of the lifetime; never freed is a class of its own.
                let life_class = b.lifetime().map_or(u32::MAX, |l| (4.0 * ((l + 1) as f64).log2()) as u32);
                let g = groups.entry((b.stack, size_class, b.alloc_us / quantum, life_class)).or_default();
                g.count += 1;
                g.alloc_sum += u128::from(b.alloc_us);
                g.life_sum += u128::from(b.lifetime().unwrap_or(0));
                g.words_sum += u128::from(b.words);
                g.samples = g.samples.saturating_add(b.nsamples);
                g.objects += estimated_objects(b.nsamples, b.words, rate);
            }
            if groups.len() <= limit || quantum >= duration {
                let mut merged: Vec<(Block, f32)> = groups
                    .into_iter()
                    .map(|((stack, _, _, life_class), g)| {
                        let mean = |sum: u128| (sum / u128::from(g.count)) as u64;
                        let alloc_us = mean(g.alloc_sum);
                        let free_us = (life_class != u32::MAX).then(|| alloc_us + mean(g.life_sum));
                        let block = Block { alloc_us, free_us, words: mean(g.words_sum), nsamples: g.samples, stack };
                        (block, g.objects as f32)
                    })
                    .collect();
                merged.sort_by_key(|(b, _)| (b.alloc_us, b.stack));
                self.aggregated = Some(Aggregation { original_blocks: self.blocks.len(), quantum_us: quantum });
                self.blocks = merged.iter().map(|m| m.0).collect();
                self.objects = Some(merged.into_iter().map(|m| m.1).collect());
                return;
            }
            quantum *= 2;
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
        for o in self.objects.iter().flatten() {
            raw.extend_from_slice(&o.to_le_bytes());
        }
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(6));
        gz.write_all(&raw).and_then(|()| gz.finish()).expect("gzip in memory cannot fail")
    }

    fn to_json(&self) -> Value {
        let tick = self.summary.end_us / u64::from(u32::MAX - 1) + 1;
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        let signed = |v: &[u32]| v.iter().map(|&x| if x == u32::MAX { -1 } else { i64::from(x) }).collect::<Vec<_>>();
        let info = &self.info;
        json!({
            "name": self.name,
            "info": {
                "start_us": info.start_time, "rate": info.sample_rate, "word_size": info.word_size,
                "executable": text(&info.executable_name), "host": text(&info.host_name),
                "runtime": text(&info.runtime_params), "context": info.context.as_deref().map(text).unwrap_or_default(),
                "pid": info.pid,
            },
            "duration_us": self.summary.end_us, "tick_us": tick, "truncated": self.truncated,
            "events": self.summary.events, "warnings": self.warnings.iter().map(|w| w.to_string()).collect::<Vec<_>>(),
            "peak": { "t": self.summary.peak_us, "samples": self.summary.peak_samples },
            "nodes": { "parent": signed(&self.parent), "frame": signed(&self.frame) },
            "nblocks": self.blocks.len(), "objects": self.objects.is_some(),
            "aggregated": self.aggregated.map(|a| json!({ "original_blocks": a.original_blocks, "quantum_us": a.quantum_us })),
            "cols": super::base64(&self.columns(tick)),
        })
    }
}

/// Write the JSON document for `traces` (one, or base and new) with the frame table
/// `frames`. No `<` occurs in it, so it can sit inside a `<script>` element.
pub fn write_json<'a>(
    frames: &'a FrameTable,
    traces: &[TraceData],
    limit: usize,
    top: usize,
    out: &mut impl Write,
) -> io::Result<()> {
    let list = &frames.frames;
    let mut strings: Vec<&str> = Vec::new();
    let mut ids: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    let mut intern = |s: &'a str| -> usize {
        *ids.entry(s).or_insert_with(|| {
            strings.push(s);
            strings.len() - 1
        })
    };
    let functions: Vec<usize> = list.iter().map(|f| intern(&f.function)).collect();
    let files: Vec<usize> = list.iter().map(|f| intern(&f.file)).collect();
    let doc = json!({
        "version": 1, "limit": limit, "top": top,
        "frames": {
            "strings": strings, "fn": functions, "file": files,
            "line": list.iter().map(|f| f.line).collect::<Vec<_>>(),
            "alloc": list.iter().map(|f| u8::from(is_allocator_frame(&f.function, &f.file))).collect::<Vec<_>>(),
        },
        "traces": traces.iter().map(TraceData::to_json).collect::<Vec<_>>(),
    });
    // Outside strings JSON has no `<`, so escaping every one keeps `</script` and `<!--` out.
    out.write_all(serde_json::to_string(&doc)?.replace('<', "\\u003c").as_bytes())
}
