//! `--format json`: the machine-readable outputs of `info`, `hotspots` and `diff`.
//!
//! Their schemas (JSON Schema, draft 2020-12) are `docs/json/{info,hotspots,diff}.schema.json`;
//! each document names its schema and version in `"schema"` (`"memtrace-info/1"`, …), and a
//! version only ever gains fields. Counts (samples, allocations, frees) are integers, and so
//! are the estimates of bytes and of object counts, rounded to the nearest ([`whole`]): an
//! estimate has no meaningful fraction, and `364999.999999999` reads as a defect. They are
//! `null` when infinite or past ±2^63 (absurd sample rates); every estimate carries its 95 %
//! interval and sample count.
//!
//! The frames of the sites in one document hold at most [`MAX_FRAME_TEXT`] bytes of names
//! and files: a site's frames past that are left out, and its `frames_left_out` says how
//! many (only crafted traces of deep stacks of long names get there).

use std::io::{self, Write};

use memtrace_rs::analysis::{inert_bytes, ranked, Analysis, Estimate, Origin};
use serde_json::{json, Value};

use super::args::Figure;
use super::{diff, hotspots};

/// Most bytes of function names, files and labels that the frames of one document hold.
pub const MAX_FRAME_TEXT: usize = 64 << 20;

/// The frames of one site as JSON values, each `size` bytes of text, as far as `room` lasts
/// (which they use up); `site` gets them as `frames`, and `frames_left_out` if some are.
fn put_frames<T>(
    site: &mut Value,
    frames: impl Iterator<Item = T>,
    size: impl Fn(&T) -> usize,
    to_json: impl Fn(T) -> Value,
    room: &mut usize,
) {
    let (mut kept, mut left_out) = (Vec::new(), 0usize);
    for frame in frames {
        let bytes = size(&frame);
        if left_out > 0 || bytes > *room {
            left_out += 1;
            continue;
        }
        *room -= bytes;
        kept.push(to_json(frame));
    }
    site["frames"] = Value::Array(kept);
    if left_out > 0 {
        site["frames_left_out"] = json!(left_out);
    }
}

/// `--format`: text for people (the default) or JSON for programs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Aligned text.
    #[default]
    Text,
    /// One JSON document (see docs/json/ for its schema).
    Json,
}

/// The output format flags of `info`, `hotspots` and `diff`.
#[derive(Debug, Clone, Copy, Default, clap::Args)]
pub struct FormatArgs {
    /// The output format.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
    /// Short for --format json.
    #[arg(long)]
    json: bool,
}

impl FormatArgs {
    /// Whether JSON was asked for.
    pub fn is_json(self) -> bool {
        self.json || self.format == Format::Json
    }
}

/// A number, or `null` when it is not finite.
fn number(v: f64) -> Value {
    if v.is_finite() {
        json!(v)
    } else {
        Value::Null
    }
}

/// An estimate of bytes or objects as the nearest integer, or `null` when it is not finite or
/// no 64-bit integer holds it.
pub fn whole(v: f64) -> Value {
    // 2^63 is exact as an f64; every finite value below it in magnitude rounds into i64.
    const LIMIT: f64 = 9_223_372_036_854_775_808.0;
    let v = v.round();
    if v.is_finite() && v.abs() < LIMIT {
        json!(v as i64)
    } else {
        Value::Null
    }
}

/// An estimate: bytes, the 95 % interval, its samples, and whether it is rough.
fn estimate(e: &Estimate) -> Value {
    json!({
        "bytes": whole(e.bytes),
        "low": whole(e.low),
        "high": whole(e.high),
        "samples": e.samples,
        "rough": e.is_rough(),
    })
}

fn by_name(figure: Figure) -> &'static str {
    match figure {
        Figure::Allocated => "allocated",
        Figure::LiveEnd => "live-end",
        Figure::LivePeak => "live-peak",
        Figure::Temporary => "temporary",
    }
}

/// Write `value` and a newline.
fn write_value(value: &Value, out: &mut impl Write) -> io::Result<()> {
    serde_json::to_writer_pretty(&mut *out, value)?;
    writeln!(out)
}

/// `info --format json`.
pub fn info(analysis: &Analysis, name: &str, out: &mut impl Write) -> io::Result<()> {
    let i = &analysis.info;
    let c = &analysis.counts;
    let text = |b: &[u8]| inert_bytes(b).into_owned();
    let origin = analysis.origin();
    let ocaml = (origin == Origin::OCaml).then(|| {
        json!({
            "minor": c.allocs_minor,
            "major": c.allocs_major,
            "external": c.allocs_external,
            "promotions": c.promotes,
            "domains": analysis.domains,
            "sampled_words": c.words,
        })
    });
    let mut peak = estimate(&analysis.estimate(analysis.peak.samples));
    peak["time_us"] = json!(analysis.peak.time.saturating_sub(i.start_time));
    let value = json!({
        "schema": "memtrace-info/1",
        "file": name,
        "executable": text(&i.executable_name),
        "host": text(&i.host_name),
        "pid": i.pid,
        "start_time_us": i.start_time,
        "sample_rate": number(i.sample_rate),
        "word_size": i.word_size,
        "runtime_params": text(&i.runtime_params),
        "context": i.context.as_deref().map(text),
        "origin": if origin == Origin::Rust { "rust" } else { "ocaml" },
        "duration_us": analysis.duration(),
        "events": c.events,
        "allocations": c.allocs(),
        "frees": c.collects,
        "samples": c.samples,
        "ocaml": ocaml,
        "allocated": estimate(&analysis.estimate(c.samples)),
        "live_end": estimate(&analysis.estimate(analysis.live_end)),
        "peak": peak,
        "location_codes": analysis.location_codes,
        "distinct_locations": analysis.distinct_locations,
        "truncated": analysis.is_truncated(),
        "closed_by_writer": analysis.closed_by_writer,
        "samples_lost": {
            "samples": analysis.lost_samples(),
            "share": number(analysis.lost_share()),
            "allocated": estimate(&analysis.estimate(analysis.lost_samples())),
            "by_cause": analysis.lost.iter().map(|l| json!({ "cause": l.cause, "samples": l.samples })).collect::<Vec<_>>(),
        },
    });
    write_value(&value, out)
}

/// `hotspots --format json`.
pub fn hotspots(analysis: &Analysis, name: &str, options: &hotspots::Options, out: &mut impl Write) -> io::Result<()> {
    let measure = options.ranking.by.measure();
    let ranked = ranked(analysis, options.ranking.sites(), measure);
    let mut room = MAX_FRAME_TEXT;
    let sites: Vec<Value> = ranked
        .iter()
        .take(options.ranking.top)
        .map(|site| {
            let tally = site.stats.get(measure);
            let mut v =
                json!({ "estimate": estimate(&analysis.estimate(tally.samples)), "count": whole(tally.objects) });
            let frames = site.frames().map(|f| &analysis.frames[f]);
            let size = |f: &&memtrace_rs::analysis::Frame| f.function.len() + f.file.len();
            let to_json =
                |f: &memtrace_rs::analysis::Frame| json!({ "function": f.function, "file": f.file, "line": f.line });
            put_frames(&mut v, frames, size, to_json, &mut room);
            v
        })
        .collect();
    let value = json!({
        "schema": "memtrace-hotspots/1",
        "file": name,
        "by": by_name(options.ranking.by.figure),
        "stacks": options.ranking.grouping.stacks,
        "total": estimate(&analysis.estimate(analysis.totals().get(measure).samples)),
        "sites_total": ranked.len(),
        "sites": sites,
    });
    write_value(&value, out)
}

/// `diff --format json`.
pub fn diff(
    base: &Analysis,
    new: &Analysis,
    names: (&str, &str),
    options: &diff::Options,
    out: &mut impl Write,
) -> io::Result<()> {
    let side = |s: &diff::Side| json!({ "value": whole(s.value), "samples": s.samples });
    let change = |c: &diff::Change| {
        json!({
            "base": side(&c.base),
            "new": side(&c.new),
            "change": whole(c.delta()),
            "margin": whole(c.margin()),
            "beyond_noise": c.beyond_noise(),
        })
    };
    let total = diff::total(base, new, options);
    let changes = diff::changes(base, new, options);
    let mut room = MAX_FRAME_TEXT;
    let shown: Vec<Value> = changes
        .iter()
        .take(options.ranking.top)
        .map(|c| {
            let mut v = change(c);
            put_frames(&mut v, c.frames.iter(), |label| label.len(), |label| json!(label), &mut room);
            v
        })
        .collect();
    let fail_above = options.fail_above.map(|limit| json!({ "exceeded": diff::exceeds(&total, limit) }));
    let value = json!({
        "schema": "memtrace-diff/1",
        "base": names.0,
        "new": names.1,
        "by": by_name(options.ranking.by.figure),
        "stacks": options.ranking.grouping.stacks,
        "per_second": options.per_second,
        "total": change(&total),
        "sites_changed": changes.len(),
        "beyond_noise": changes.iter().filter(|c| c.beyond_noise()).count(),
        "changes": shown,
        "fail_above": fail_above,
    });
    write_value(&value, out)
}
