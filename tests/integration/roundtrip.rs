//! Round-trip property tests: traces built with `trace::Writer` read back with
//! `trace::Reader` give exactly what was written, up to the truncations FORMAT.md
//! documents:
//!
//! - §5.2 clamping of line / columns and §1.4 cutting of names at NUL (modelled here
//!   independently, and checked against `Location::as_encoded`);
//! - §5.3 replacement of lists with more than 255 entries or a worst case above 4096 bytes
//!   by the unknown location (modelled here, checked against `location_codec::must_truncate`);
//! - §7.5 the 4096-byte backtrace budget, which drops innermost frames: the reader's
//!   backtrace must be a prefix (outermost first) of the written callstack reversed, and
//!   equal to it when at most 400 frames had to be encoded (400 misses of 10 bytes fit);
//! - §7.7 a common prefix longer than the (truncated) previous backtrace: the reader then
//!   repeats the previous backtrace.
//!
//! Everything else must be exact: the trace info (with empty context read as none), the
//! order, times, domains and kinds of events, ids, lengths, sample counts, sources, common
//! prefixes, and the location list of every frame.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use crate::util::traces::Rng;
use memtrace_rs::__internals::location_codec::{self, Location};
use memtrace_rs::trace::{AllocSource, EventKind, Info, NewAlloc, ObjectId, Reader, Timestamp, Writer};
use proptest::collection::vec;
use proptest::prelude::*;

// ---------------------------------------------------------------------------------------
// Test cases
// ---------------------------------------------------------------------------------------

/// Size of the pool of shared codes (recursion, shared helpers).
const POOL: usize = 48;
/// Deepest callstack a case builds.
const MAX_DEPTH: usize = 3000;
/// Frames that always fit the backtrace budget: a lookup starts while the position is at
/// most 4086, so 409 ten-byte misses always fit; 400 leaves a margin.
const ALWAYS_FITS: usize = 400;

fn pool_code(i: u8) -> u64 {
    0x5500_0000_1000 + i as u64 * 0x48
}

fn fresh_code(n: u64) -> u64 {
    0x7F00_0000_0000 + n * 0x30
}

/// A part of a callstack, outermost first.
#[derive(Debug, Clone)]
enum Seg {
    /// `n` codes never used before in the case (cache misses).
    Fresh(usize),
    /// Codes from the shared pool.
    Pool(Vec<u8>),
    /// A pattern of pool codes repeated (recursion): prediction runs, longer than 255.
    Recursion { pattern: Vec<u8>, repeats: usize },
    /// Explicit codes.
    Codes(Vec<u64>),
}

/// How to build the next callstack of a domain: keep the outer `keep` frames of that
/// domain's previous callstack, then append the segments.
#[derive(Debug, Clone)]
struct StackSpec {
    keep: usize,
    segs: Vec<Seg>,
    /// Innermost slots to leave out (`NewAlloc::drop`), capped at the stack's length.
    drop: usize,
}

#[derive(Debug, Clone)]
enum Op {
    Alloc {
        dom: usize,
        dt: u64,
        stack: StackSpec,
        length: u64,
        nsamples: u64,
        source: AllocSource,
    },
    /// `count` allocations with the domain's previous callstack, with varied sizes.
    Burst {
        dom: usize,
        dt: u64,
        count: usize,
    },
    /// Collect an object allocated earlier on any domain.
    Collect {
        dom: usize,
        dt: u64,
        pick: usize,
    },
    /// Promote an object allocated earlier on this domain.
    Promote {
        dom: usize,
        dt: u64,
        pick: usize,
    },
    Flush,
    /// Ask for the next id of the domain; the next allocation there must get it.
    NextId {
        dom: usize,
    },
}

#[derive(Debug, Clone)]
struct Case {
    info: Info,
    /// Domains used by the ops (`dom` indexes this modulo its length); the first is the
    /// initial domain.
    domains: Vec<u16>,
    /// Location lists; a code's list is chosen by hashing the code.
    lists: Vec<Vec<Location>>,
    ops: Vec<Op>,
}

impl Case {
    fn list_of(&self, code: u64) -> usize {
        if self.lists.is_empty() {
            usize::MAX
        } else {
            ((code.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) % self.lists.len() as u64) as usize
        }
    }
}

// ---------------------------------------------------------------------------------------
// The model of what the reader returns
// ---------------------------------------------------------------------------------------

#[derive(Debug)]
enum Expected {
    Alloc {
        time: Timestamp,
        domain: u16,
        id: ObjectId,
        length: u64,
        nsamples: u64,
        source: AllocSource,
        common_prefix: usize,
        /// The callstack minus dropped slots, outermost first.
        full: Vec<u64>,
    },
    Promote {
        time: Timestamp,
        domain: u16,
        id: ObjectId,
    },
    Collect {
        time: Timestamp,
        domain: u16,
        id: ObjectId,
    },
}

fn cut_at_nul(s: &[u8]) -> Vec<u8> {
    s.iter().copied().take_while(|&b| b != 0).collect()
}

/// §5.2 and §1.4, written from the spec.
fn encoded_location(l: &Location) -> Location {
    let clamp = |v: u32, max: u32| if v > max { max } else { v };
    let model = Location {
        filename: cut_at_nul(&l.filename).into(),
        line: clamp(l.line, 0xF_FFFF),
        start_char: clamp(l.start_char, 0xFF),
        end_char: clamp(l.end_char, 0x3FF),
        defname: cut_at_nul(&l.defname).into(),
    };
    assert_eq!(model, l.as_encoded());
    model
}

/// §5.3, written from the spec: what the reader stores for a list.
fn encoded_list(list: &[Location]) -> Vec<Location> {
    let worst = 9 + list.iter().map(|l| 6 + l.filename.len() + 1 + l.defname.len() + 1).sum::<usize>();
    let truncate = list.len() > 255 || worst > 4096;
    assert_eq!(truncate, location_codec::must_truncate(list));
    if truncate {
        vec![Location {
            filename: b"<unknown>"[..].into(),
            line: 1,
            start_char: 1,
            end_char: 1,
            defname: b"??"[..].into(),
        }]
    } else {
        list.iter().map(encoded_location).collect()
    }
}

fn expected_info(info: &Info) -> Info {
    Info {
        executable_name: cut_at_nul(&info.executable_name),
        host_name: cut_at_nul(&info.host_name),
        runtime_params: cut_at_nul(&info.runtime_params),
        context: info.context.as_deref().map(cut_at_nul).filter(|c| !c.is_empty()),
        ..info.clone()
    }
}

/// What a run covered, for the deterministic tests to assert on.
#[derive(Debug, Default)]
struct Stats {
    bytes: usize,
    events: usize,
    allocs: usize,
    max_id: ObjectId,
    /// Backtraces the reader returned shorter than written (§7.5).
    truncated: usize,
    /// Events for which the reader repeated the previous backtrace (§7.7).
    repeated: usize,
    /// Location lists replaced by the unknown location (§5.3) among looked-up codes.
    unknown_lists: usize,
    /// Largest gap between consecutive events, and the span of the trace.
    max_gap: u64,
    span: u64,
    domains: usize,
    deepest: usize,
    short_form_candidates: usize,
}

// ---------------------------------------------------------------------------------------
// Writing
// ---------------------------------------------------------------------------------------

struct Model<'c> {
    case: &'c Case,
    writer: Writer<Vec<u8>>,
    lists: Vec<Arc<[Location]>>,
    now: Timestamp,
    fresh: u64,
    /// Per domain: the previous callstack (writer orientation) and its drop (§6.2).
    prev: HashMap<u16, (Vec<u64>, usize)>,
    all_ids: Vec<ObjectId>,
    ids_by_domain: HashMap<u16, Vec<ObjectId>>,
    seen_ids: HashSet<ObjectId>,
    next_id: HashMap<u16, ObjectId>,
    expected: Vec<Expected>,
    stats: Stats,
}

impl<'c> Model<'c> {
    fn new(case: &'c Case) -> Model<'c> {
        Model {
            case,
            writer: Writer::new(Vec::new(), &case.info).unwrap(),
            lists: case.lists.iter().map(|l| Arc::from(&l[..])).collect(),
            now: case.info.start_time,
            fresh: 0,
            prev: HashMap::new(),
            all_ids: Vec::new(),
            ids_by_domain: HashMap::new(),
            seen_ids: HashSet::new(),
            next_id: HashMap::new(),
            expected: Vec::new(),
            stats: Stats::default(),
        }
    }

    fn domain(&self, dom: usize) -> u16 {
        self.case.domains[dom % self.case.domains.len()]
    }

    fn advance(&mut self, dt: u64) -> Timestamp {
        self.now += dt;
        self.stats.max_gap = self.stats.max_gap.max(dt);
        self.now
    }

    /// Build a callstack (writer orientation) from a spec.
    fn build_stack(&mut self, domain: u16, spec: &StackSpec) -> (Vec<u64>, usize) {
        let mut outer_first: Vec<u64> = match self.prev.get(&domain) {
            Some((s, _)) => s.iter().rev().take(spec.keep).copied().collect(),
            None => Vec::new(),
        };
        for seg in &spec.segs {
            match seg {
                Seg::Fresh(n) => {
                    for _ in 0..*n {
                        self.fresh += 1;
                        outer_first.push(fresh_code(self.fresh));
                    }
                }
                Seg::Pool(ixs) => outer_first.extend(ixs.iter().map(|&i| pool_code(i))),
                Seg::Recursion { pattern, repeats } => {
                    for _ in 0..*repeats {
                        outer_first.extend(pattern.iter().map(|&i| pool_code(i)));
                    }
                }
                Seg::Codes(codes) => outer_first.extend_from_slice(codes),
            }
        }
        outer_first.truncate(MAX_DEPTH);
        outer_first.reverse();
        let drop = spec.drop.min(outer_first.len());
        (outer_first, drop)
    }

    fn alloc(&mut self, domain: u16, stack: Vec<u64>, drop: usize, length: u64, nsamples: u64, source: AllocSource) {
        // §6.2, from the spec.
        let (prev, prev_drop) = self.prev.get(&domain).map(|(s, d)| (&s[..], *d)).unwrap_or((&[], 0));
        let (mut i, mut j) = (stack.len(), prev.len());
        while i > drop && j > prev_drop && stack[i - 1] == prev[j - 1] {
            i -= 1;
            j -= 1;
        }
        let common_prefix = stack.len() - i;
        let full: Vec<u64> = stack[drop..].iter().rev().copied().collect();
        if (1..=16).contains(&length) && source == AllocSource::Minor && nsamples == 1 && i < 256 {
            self.stats.short_form_candidates += 1;
        }
        let lists = &self.lists;
        let case = self.case;
        let alloc = NewAlloc { length, nsamples, source, callstack: &stack, drop };
        let id = self
            .writer
            .put_alloc(domain, self.now, &alloc, |code| {
                lists.get(case.list_of(code)).cloned().unwrap_or_else(|| Arc::from(Vec::new()))
            })
            .unwrap();
        if let Some(want) = self.next_id.remove(&domain) {
            assert_eq!(id, want, "next_alloc_id promised another id");
        }
        assert!(self.seen_ids.insert(id), "id {id} given twice");
        if let Some(&last) = self.ids_by_domain.get(&domain).and_then(|v| v.last()) {
            assert!(id > last, "ids must increase within a domain");
        }
        self.all_ids.push(id);
        self.ids_by_domain.entry(domain).or_default().push(id);
        self.stats.max_id = self.stats.max_id.max(id);
        self.stats.deepest = self.stats.deepest.max(stack.len());
        self.expected.push(Expected::Alloc {
            time: self.now,
            domain,
            id,
            length,
            nsamples,
            source,
            common_prefix,
            full,
        });
        self.prev.insert(domain, (stack, drop));
    }

    fn run(&mut self, op: &Op) {
        match *op {
            Op::Alloc { dom, dt, ref stack, length, nsamples, source } => {
                let domain = self.domain(dom);
                self.advance(dt);
                let (stack, drop) = self.build_stack(domain, stack);
                self.alloc(domain, stack, drop, length, nsamples, source);
            }
            Op::Burst { dom, dt, count } => {
                let domain = self.domain(dom);
                let (stack, drop) = self.prev.get(&domain).cloned().unwrap_or_default();
                for k in 0..count {
                    self.advance(if k == 0 { dt } else { k as u64 % 3 });
                    let length = 1 + (k as u64 * 7) % 20;
                    let nsamples = if k % 7 == 3 { 2 } else { 1 };
                    let source = match k % 5 {
                        0 => AllocSource::Major,
                        1 => AllocSource::External,
                        _ => AllocSource::Minor,
                    };
                    self.alloc(domain, stack.clone(), drop, length, nsamples, source);
                }
            }
            Op::Collect { dom, dt, pick } => {
                if self.all_ids.is_empty() {
                    return;
                }
                let domain = self.domain(dom);
                let time = self.advance(dt);
                let id = self.all_ids[pick % self.all_ids.len()];
                self.writer.put_collect(domain, time, id).unwrap();
                self.expected.push(Expected::Collect { time, domain, id });
            }
            Op::Promote { dom, dt, pick } => {
                let domain = self.domain(dom);
                let Some(ids) = self.ids_by_domain.get(&domain).filter(|v| !v.is_empty()) else { return };
                let id = ids[pick % ids.len()];
                let time = self.advance(dt);
                self.writer.put_promote(domain, time, id).unwrap();
                self.expected.push(Expected::Promote { time, domain, id });
            }
            Op::Flush => self.writer.flush().unwrap(),
            Op::NextId { dom } => {
                let domain = self.domain(dom);
                let id = self.writer.next_alloc_id(domain).unwrap();
                self.next_id.insert(domain, id);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Reading back and checking
// ---------------------------------------------------------------------------------------

fn check(case: &Case, bytes: &[u8], expected: &[Expected], decode: bool, stats: &mut Stats) {
    let mut reader = Reader::new(bytes).unwrap();
    let info = reader.info();
    assert_eq!(info.sample_rate.to_bits(), case.info.sample_rate.to_bits());
    let want_info = expected_info(&case.info);
    assert_eq!(Info { sample_rate: 0.0, ..info.clone() }, Info { sample_rate: 0.0, ..want_info });
    reader.set_decode_backtraces(decode);
    let mut want_lists: HashMap<usize, Vec<Location>> = HashMap::new();
    let mut last: HashMap<u16, Vec<u64>> = HashMap::new();
    for (n, want) in expected.iter().enumerate() {
        let event = match reader.next_event() {
            Ok(Some(e)) => e,
            other => panic!("event {n} of {}: expected {want:?}, got {other:?}", expected.len()),
        };
        match (event.kind, want) {
            (
                EventKind::Alloc(a),
                &Expected::Alloc { time, domain, id, length, nsamples, source, common_prefix, ref full },
            ) => {
                assert_eq!(
                    (event.time, event.domain, a.id, a.length, a.nsamples, a.source, a.common_prefix),
                    (time, domain, id, length, nsamples, source, common_prefix as u64),
                    "event {n}"
                );
                let bt = a.backtrace;
                if !decode {
                    assert!(bt.is_empty());
                    continue;
                }
                let previous = last.entry(domain).or_default();
                if common_prefix > previous.len() {
                    // §7.7: the previous backtrace was truncated and this one shares more
                    // with the writer's full copy than the reader has.
                    assert_eq!(bt, &previous[..], "event {n}: §7.7 must repeat the previous backtrace");
                    stats.repeated += 1;
                } else {
                    assert!(
                        full.starts_with(bt),
                        "event {n}: backtrace ({} frames) is not a prefix of the callstack ({} frames)",
                        bt.len(),
                        full.len()
                    );
                    assert!(bt.len() >= common_prefix, "event {n}");
                    if full.len() > common_prefix {
                        assert!(bt.len() > common_prefix, "event {n}: no frame encoded at all");
                    }
                    if full.len() - common_prefix <= ALWAYS_FITS {
                        assert_eq!(bt.len(), full.len(), "event {n}: backtrace truncated though it fits");
                    }
                    if bt.len() < full.len() {
                        stats.truncated += 1;
                    }
                }
                for &code in bt {
                    let got = event.locations.get(code).unwrap_or_else(|e| panic!("event {n}: {e}"));
                    let ix = case.list_of(code);
                    let want = want_lists
                        .entry(ix)
                        .or_insert_with(|| case.lists.get(ix).map(|l| encoded_list(l)).unwrap_or_default());
                    assert_eq!(got, &want[..], "event {n}: locations of code {code:#x}");
                    if case.lists.get(ix).is_some_and(|l| location_codec::must_truncate(l)) {
                        stats.unknown_lists += 1;
                    }
                }
                previous.clear();
                previous.extend_from_slice(bt);
            }
            (EventKind::Promote { id: got }, &Expected::Promote { time, domain, id })
            | (EventKind::Collect { id: got }, &Expected::Collect { time, domain, id }) => {
                assert_eq!((event.time, event.domain, got), (time, domain, id), "event {n}");
            }
            (got, want) => panic!("event {n}: expected {want:?}, got {got:?}"),
        }
    }
    assert!(reader.next_event().unwrap().is_none(), "more events than written");
    assert!(reader.warnings().is_empty(), "{:?}", reader.warnings());
    assert!(!reader.is_truncated());
}

/// Write the case, read it back twice (with and without backtraces) and check it.
fn run_case(case: &Case) -> Stats {
    let mut model = Model::new(case);
    for op in &case.ops {
        model.run(op);
    }
    let Model { writer, expected, mut stats, .. } = model;
    let bytes = writer.close().unwrap();
    stats.bytes = bytes.len();
    stats.events = expected.len();
    stats.allocs = expected.iter().filter(|e| matches!(e, Expected::Alloc { .. })).count();
    stats.span = expected.last().map_or(0, |e| match e {
        Expected::Alloc { time, .. } | Expected::Promote { time, .. } | Expected::Collect { time, .. } => {
            time - case.info.start_time
        }
    });
    stats.domains = expected
        .iter()
        .map(|e| match e {
            Expected::Alloc { domain, .. } | Expected::Promote { domain, .. } | Expected::Collect { domain, .. } => {
                *domain
            }
        })
        .collect::<HashSet<_>>()
        .len();
    check(case, &bytes, &expected, true, &mut stats);
    check(case, &bytes, &expected, false, &mut Stats::default());
    if std::env::var_os("ROUNDTRIP_STATS").is_some() {
        eprintln!("{stats:?}");
    }
    stats
}

// ---------------------------------------------------------------------------------------
// Strategies
// ---------------------------------------------------------------------------------------

fn name(prefix: &'static str) -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        20 => (0..40usize).prop_map(move |i| format!("{prefix}_{i}.ml").into_bytes()),
        5 => (0..40u8).prop_map(|i| vec![b'a' + i % 26, b'0' + i / 26]),
        1 => (4000..5000usize).prop_map(|n| vec![b'L'; n]),
        1 => (0..40usize).prop_map(move |i| format!("{prefix}{i}\0after the nul").into_bytes()),
        1 => Just(Vec::new()),
    ]
}

fn location() -> impl Strategy<Value = Location> {
    (
        name("file"),
        prop_oneof![8 => 0..5000u32, 1 => Just(0xF_FFFF), 1 => 0x10_0000..=u32::MAX],
        prop_oneof![8 => 0..256u32, 1 => 256..=u32::MAX],
        prop_oneof![8 => 0..1024u32, 1 => 1024..=u32::MAX],
        name("Mod.fn"),
    )
        .prop_map(|(filename, line, start_char, end_char, defname)| Location {
            filename: filename.into(),
            line,
            start_char,
            end_char,
            defname: defname.into(),
        })
}

/// A location with one-byte names (40 distinct of each), so that lists of about 255 of
/// them stay under the 4096-byte limit and the entry limit is what matters.
fn small_location() -> impl Strategy<Value = Location> {
    (0..40u8, 0..40u8, 0..100u32).prop_map(|(f, d, line)| Location {
        filename: vec![b'A' + f].into(),
        line,
        start_char: 1,
        end_char: 2,
        defname: vec![b'a' + d].into(),
    })
}

fn location_list() -> impl Strategy<Value = Vec<Location>> {
    prop_oneof![
        20 => vec(location(), 0..=3),
        2 => vec(small_location(), 250..=300),
    ]
}

fn seg() -> impl Strategy<Value = Seg> {
    prop_oneof![
        6 => (1..8usize).prop_map(Seg::Fresh),
        1 => (380..700usize).prop_map(Seg::Fresh),
        6 => vec(0..POOL as u8, 1..12).prop_map(Seg::Pool),
        2 => (vec(0..POOL as u8, 1..4), 1..400usize)
            .prop_map(|(pattern, repeats)| Seg::Recursion { pattern, repeats }),
        2 => vec(pseudo_code(), 1..18).prop_map(Seg::Codes),
    ]
}

/// The runtime's pseudo-frames for spans (tag 0xFFFF) and thread names (tag 0xFFFD): small
/// numbers under a tag in the top 16 bits.
fn pseudo_code() -> impl Strategy<Value = u64> {
    prop_oneof![(0..100u64).prop_map(|n| 0xFFFF_0000_0000_0000 | n), (0..6u64).prop_map(|n| 0xFFFD_0000_0000_0000 | n),]
}

fn stack_spec() -> impl Strategy<Value = StackSpec> {
    (
        prop_oneof![2 => Just(0usize), 4 => 0..50usize, 2 => 0..1000usize, 1 => Just(usize::MAX)],
        vec(seg(), 0..4),
        prop_oneof![8 => Just(0usize), 1 => Just(1usize), 1 => Just(2usize)],
    )
        .prop_map(|(keep, segs, drop)| StackSpec { keep, segs, drop })
}

fn dt() -> BoxedStrategy<u64> {
    prop_oneof![
        4 => Just(0u64),
        8 => 0..1000u64,
        2 => 0..3_000_000u64,
        1 => prop_oneof![
            Just(30_000_000u64),
            Just(30_000_001),
            Just(1 << 25),
            Just((1 << 25) + 1),
            30_000_000..80_000_000u64,
        ],
    ]
    .boxed()
}

fn source() -> impl Strategy<Value = AllocSource> {
    prop_oneof![4 => Just(AllocSource::Minor), 1 => Just(AllocSource::Major), 1 => Just(AllocSource::External)]
}

fn length() -> impl Strategy<Value = u64> {
    prop_oneof![
        6 => 1..=16u64,
        1 => Just(0u64),
        2 => 17..100_000u64,
        1 => 65_536..(1u64 << 40),
        1 => Just(i64::MAX as u64),
    ]
}

fn nsamples() -> impl Strategy<Value = u64> {
    prop_oneof![6 => Just(1u64), 2 => 2..300u64, 1 => Just(i64::MAX as u64)]
}

fn op(max_burst: usize) -> impl Strategy<Value = Op> {
    let dom = 0..4usize;
    prop_oneof![
        10 => (dom.clone(), dt(), stack_spec(), length(), nsamples(), source()).prop_map(
            |(dom, dt, stack, length, nsamples, source)| Op::Alloc { dom, dt, stack, length, nsamples, source }
        ),
        1 => (dom.clone(), dt(), 1..=max_burst).prop_map(|(dom, dt, count)| Op::Burst { dom, dt, count }),
        4 => (dom.clone(), dt(), any::<usize>()).prop_map(|(dom, dt, pick)| Op::Collect { dom, dt, pick }),
        2 => (dom.clone(), dt(), any::<usize>()).prop_map(|(dom, dt, pick)| Op::Promote { dom, dt, pick }),
        1 => Just(Op::Flush),
        1 => dom.prop_map(|dom| Op::NextId { dom }),
    ]
}

fn bytes_with_nul() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => vec(1..=255u8, 0..20),
        1 => vec(any::<u8>(), 0..20),
    ]
}

fn info() -> impl Strategy<Value = Info> {
    (
        // Rates in (0, 1] (the reader rejects others), from the tiniest subnormal up.
        prop_oneof![
            3 => (1u64..=(1 << 53)).prop_map(|k| k as f64 / (1u64 << 53) as f64),
            1 => Just(1.0),
            1 => (1u64..0x3FF0_0000_0000_0000).prop_map(f64::from_bits),
        ],
        1..=u8::MAX,
        (bytes_with_nul(), bytes_with_nul(), bytes_with_nul()),
        any::<u64>(),
        prop_oneof![3 => Just(0u16), 1 => any::<u16>()],
        prop_oneof![
            2 => 0..(1u64 << 52),
            1 => ((1u64 << 25) - 100)..((1u64 << 25) + 100),
            1 => (0..1000u64).prop_map(|k| 1_600_000_000_000_000 + (1 << 25) * k - 3),
        ],
        proptest::option::of(bytes_with_nul()),
    )
        .prop_map(|(sample_rate, word_size, (exe, host, params), pid, initial_domain, start_time, context)| Info {
            sample_rate,
            word_size,
            executable_name: exe,
            host_name: host,
            runtime_params: params,
            pid,
            initial_domain,
            start_time,
            context,
        })
}

fn case(max_ops: usize, max_burst: usize) -> impl Strategy<Value = Case> {
    (info(), vec(any::<u16>(), 0..4), vec(location_list(), 0..48), vec(op(max_burst), 1..max_ops)).prop_map(
        |(info, more_domains, lists, ops)| {
            let mut domains = vec![info.initial_domain];
            for d in more_domains {
                if !domains.contains(&d) {
                    domains.push(d);
                }
            }
            Case { info, domains, lists, ops }
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Random interleavings of allocs, promotes, collects, flushes and domain switches,
    /// with random callstacks and location lists.
    #[test]
    fn random_traces_round_trip(case in case(120, 50)) {
        run_case(&case);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(8))]

    /// Fewer, longer cases: long bursts so that domains use up id chunks (> 10 000 ids).
    #[test]
    fn long_random_traces_round_trip(case in case(200, 3000)) {
        run_case(&case);
    }
}

// ---------------------------------------------------------------------------------------
// Deterministic cases
// ---------------------------------------------------------------------------------------

fn simple_info(start_time: Timestamp) -> Info {
    crate::util::traces::test_info(start_time, 1234)
}

fn alloc_op(dom: usize, dt: u64, keep: usize, segs: Vec<Seg>) -> Op {
    Op::Alloc { dom, dt, stack: StackSpec { keep, segs, drop: 0 }, length: 4, nsamples: 1, source: AllocSource::Minor }
}

/// A trace of 60 000 events over four interleaved domains and more than ten minutes:
/// id chunks roll over on every domain, the 25-bit timestamps wrap many times (gaps of
/// up to 80 s), and collects refer to objects of other domains.
#[test]
fn large_interleaving_rolls_ids_and_wraps_time() {
    let mut rng = Rng::new(7);
    let mut lists: Vec<Vec<Location>> = Vec::new();
    for i in 0..60 {
        let n = rng.index(3) + 1;
        lists.push(
            (0..n)
                .map(|k| Location {
                    filename: format!("src/f{}.rs", (i + k) % 45).into_bytes().into(),
                    line: rng.below(1000) as u32,
                    start_char: rng.below(100) as u32,
                    end_char: rng.below(200) as u32,
                    defname: format!("f{}::g{}", i % 45, k).into_bytes().into(),
                })
                .collect(),
        );
    }
    let mut ops = Vec::new();
    for _ in 0..45_000 {
        let dom = if rng.percent(97) { 0 } else { rng.index(4) };
        let dt = match rng.below(1000) {
            0..=1 => 30_000_000 + rng.below(50_000_000),
            2..=20 => rng.below(3_000_000),
            _ => rng.below(200),
        };
        let r = rng.below(100);
        ops.push(if r < 60 {
            let mut segs = vec![Seg::Pool((0..rng.below(6)).map(|_| rng.below(POOL as u64) as u8).collect())];
            if rng.percent(10) {
                segs.push(Seg::Fresh(1 + rng.index(5)));
            }
            Op::Alloc {
                dom,
                dt,
                stack: StackSpec { keep: rng.index(12), segs, drop: usize::from(rng.percent(5)) },
                length: 1 + rng.below(40),
                nsamples: 1 + u64::from(rng.percent(10)),
                source: if rng.percent(80) { AllocSource::Minor } else { AllocSource::External },
            }
        } else if r < 65 {
            Op::Promote { dom, dt, pick: rng.index(usize::MAX) }
        } else {
            Op::Collect { dom, dt, pick: rng.index(usize::MAX) }
        });
    }
    let case = Case { info: simple_info((1 << 25) - 7), domains: vec![0, 1, 2, 9], lists, ops };
    let stats = run_case(&case);
    eprintln!("{stats:?}");
    assert_eq!(stats.domains, 4);
    assert!(stats.allocs > 25_000);
    assert!(stats.max_id > 40_000, "id chunks must roll over: max id {}", stats.max_id);
    assert!(stats.max_gap > 1 << 25, "need a gap longer than the 25-bit timestamp range");
    assert!(stats.span > 600_000_000);
}

/// §7.5 and §7.7 explicitly: a callstack of 600 fresh frames is truncated at the callee
/// end; the next one shares 500 outer frames with it, more than the reader has, so the
/// reader repeats the truncated backtrace; a third one shares 100 and is complete.
#[test]
fn common_prefix_longer_than_truncated_predecessor() {
    let case = Case {
        info: simple_info(1_000_000),
        domains: vec![0],
        lists: vec![vec![Location {
            filename: b"a.ml".to_vec().into(),
            line: 1,
            start_char: 2,
            end_char: 3,
            defname: b"A.f".to_vec().into(),
        }]],
        ops: vec![
            alloc_op(0, 1, 0, vec![Seg::Fresh(600)]),
            alloc_op(0, 1, 500, vec![Seg::Fresh(3)]),
            alloc_op(0, 1, 500, vec![Seg::Fresh(3)]),
            alloc_op(0, 1, 100, vec![Seg::Fresh(2)]),
            alloc_op(0, 1, usize::MAX, vec![]),
        ],
    };
    let stats = run_case(&case);
    assert_eq!(stats.repeated, 2);
    assert_eq!(stats.truncated, 1);

    // The same, by hand.
    let mut model = Model::new(&case);
    for op in &case.ops {
        model.run(op);
    }
    let bytes = model.writer.close().unwrap();
    let mut reader = Reader::new(&bytes[..]).unwrap();
    let mut bts = Vec::new();
    while let Some(e) = reader.next_event().unwrap() {
        if let EventKind::Alloc(a) = e.kind {
            bts.push((a.common_prefix, a.backtrace.to_vec()));
        }
    }
    let first = &bts[0].1;
    assert!((409..600).contains(&first.len()), "{}", first.len());
    assert_eq!(bts[1], (500, first.clone()));
    assert_eq!(bts[2], (500, first.clone()));
    assert_eq!(bts[3].0, 100);
    assert_eq!(bts[3].1.len(), 102);
    assert_eq!(bts[3].1[..100], first[..100]);
    assert_eq!(bts[4], (102, bts[3].1.clone()));
}

/// Deep recursion: runs of predictions longer than 255 (several hitN codewords), a
/// 9 000-frame stack that costs a few bytes, repeated and extended.
#[test]
fn deep_recursion_round_trips() {
    let recursion = |pattern: Vec<u8>, repeats| Seg::Recursion { pattern, repeats };
    let case = Case {
        info: simple_info(5),
        domains: vec![0, 3],
        lists: vec![],
        ops: vec![
            alloc_op(0, 0, 0, vec![Seg::Pool(vec![1, 2]), recursion(vec![5], 3000)]),
            alloc_op(1, 0, 0, vec![recursion(vec![7, 8, 9], 1000)]),
            alloc_op(0, 0, usize::MAX, vec![recursion(vec![6], 300)]),
            alloc_op(1, 0, 2000, vec![recursion(vec![7, 8, 9], 900)]),
            alloc_op(0, 0, 0, vec![recursion(vec![3, 4], 1500)]),
            Op::Burst { dom: 0, dt: 1, count: 20 },
        ],
    };
    let stats = run_case(&case);
    assert_eq!(stats.truncated, 0);
    assert!(stats.deepest >= 3000);
    assert!(stats.bytes < 20_000, "recursion should compress: {} bytes", stats.bytes);
}

/// More than 4096 bytes' worth of misses in one backtrace, then the same stack again (all
/// hits now, but still cut where the reader's copy ends — §7.7 on an equal stack).
#[test]
fn budget_truncation_with_many_fresh_codes() {
    let codes: Vec<u64> = (0..1000).map(|i| 0x6000_0000 + i * 0x1357).collect();
    let case = Case {
        info: simple_info(77),
        domains: vec![0],
        lists: vec![vec![]],
        ops: vec![
            alloc_op(0, 0, 0, vec![Seg::Codes(codes.clone())]),
            alloc_op(0, 0, 0, vec![Seg::Codes(codes.clone())]),
            alloc_op(0, 0, 0, vec![Seg::Codes(codes[..300].to_vec())]),
            alloc_op(0, 0, 0, vec![Seg::Codes(codes)]),
        ],
    };
    let stats = run_case(&case);
    assert!(stats.truncated >= 2, "{stats:?}");
}

/// Location lists at the limits of §5.3 and past the MTF table sizes.
#[test]
fn location_lists_at_the_limits() {
    let loc = |file: &[u8], def: &[u8]| Location {
        filename: file.to_vec().into(),
        line: 10,
        start_char: 20,
        end_char: 30,
        defname: def.to_vec().into(),
    };
    // 9 + 6 + (f + 1) + (d + 1) = 4096 exactly when f + d = 4079.
    let at_limit = vec![loc(&vec![b'f'; 4000], &[b'd'; 79])];
    let past_limit = vec![loc(&vec![b'f'; 4000], &[b'd'; 80])];
    let entries_255: Vec<Location> =
        (0..255).map(|i| loc(&[b'A' + (i % 40) as u8], &[b'a' + (i % 37) as u8])).collect();
    let entries_256: Vec<Location> =
        (0..256).map(|i| loc(&[b'A' + (i % 40) as u8], &[b'a' + (i % 37) as u8])).collect();
    let clamped = vec![Location {
        filename: b"clamp\0me".to_vec().into(),
        line: u32::MAX,
        start_char: 256,
        end_char: 1024,
        defname: b"\0".to_vec().into(),
    }];
    let mut lists = vec![at_limit.clone(), past_limit.clone(), entries_255.clone(), entries_256, clamped, vec![]];
    // 70 lists with distinct files and defnames (more than 31 of each).
    for i in 0..70 {
        lists.push(vec![loc(format!("file{i}.ml").as_bytes(), format!("def{i}").as_bytes())]);
    }
    assert!(!location_codec::must_truncate(&at_limit));
    assert!(location_codec::must_truncate(&past_limit));
    assert!(!location_codec::must_truncate(&entries_255));
    // One code per list, found by searching codes that hash to each list.
    let mut probe = Case { info: simple_info(9), domains: vec![0], lists, ops: vec![] };
    let mut codes_for: Vec<Option<u64>> = vec![None; probe.lists.len()];
    let mut code = 0x4000_0000u64;
    while codes_for.iter().any(Option::is_none) {
        code += 8;
        let ix = probe.list_of(code);
        codes_for[ix].get_or_insert(code);
    }
    let codes: Vec<u64> = codes_for.into_iter().map(Option::unwrap).collect();
    for chunk in codes.chunks(7) {
        probe.ops.push(alloc_op(0, 10, 0, vec![Seg::Codes(chunk.to_vec())]));
    }
    // Again after the tables have cycled, and all at once.
    probe.ops.push(alloc_op(0, 10, 0, vec![Seg::Codes(codes.iter().rev().copied().collect())]));
    let stats = run_case(&probe);
    assert!(stats.unknown_lists >= 2);
}

/// A trace shaped like the runtime's: stacks whose outermost frames are span and thread
/// pseudo-frames (small numbers under a tag in the top 16 bits) with locations in their
/// convention, a span description at its 200-byte bound and a long call-site file, read back
/// exactly: the same backtraces, and every code bound to the same location before its use.
#[test]
fn span_and_thread_frames_round_trip() {
    use memtrace_rs::trace::{SPAN_FILE_PREFIX, THREAD_FILE};
    let span = |n: u64| 0xFFFF_0000_0000_0000 | n;
    let thread = |n: u64| 0xFFFD_0000_0000_0000 | n;
    let location = |filename: String, line: u32, defname: String| Location {
        filename: filename.into_bytes().into(),
        line,
        start_char: 0,
        end_char: 0,
        defname: defname.into_bytes().into(),
    };
    let locations_of = |code: u64| -> Arc<[Location]> {
        let n = code as u32;
        Arc::new([match code >> 48 {
            0xFFFF if n == 0 => location(
                format!("{SPAN_FILE_PREFIX}{}", "deep/".repeat(200)),
                0xFFFFF,
                format!("{}…", "request{route=/api/users}".repeat(8).split_at(197).0),
            ),
            0xFFFF => location(format!("{SPAN_FILE_PREFIX}src/server.rs"), 10 + n, format!("span{n}{{kind=k{n}}}")),
            0xFFFD => location(THREAD_FILE.to_owned(), 0, format!("tokio-runtime-worker-{n}")),
            _ => location("src/code.rs".to_owned(), n, format!("f{n}")),
        }])
    };
    let mut stacks: Vec<Vec<u64>> = Vec::new();
    for i in 0..2000u64 {
        // Innermost first: code, then spans innermost first, then the thread.
        let mut stack: Vec<u64> = (0..1 + i % 9).map(|d| 0x5555_0000_0000 + (i % 13 + d) * 0x40).collect();
        stack.extend((0..i % 5).rev().map(|d| span((d * 17 + i) % 40)));
        stack.push(thread(i % 4));
        stacks.push(stack);
    }
    let mut writer = Writer::new(Vec::new(), &simple_info(1)).unwrap();
    for (time, stack) in stacks.iter().enumerate() {
        let alloc = NewAlloc { length: 4, nsamples: 1, source: AllocSource::External, callstack: stack, drop: 0 };
        writer.put_alloc(0, time as Timestamp + 1, &alloc, locations_of).unwrap();
    }
    let bytes = writer.close().unwrap();
    let mut reader = Reader::new(&bytes[..]).unwrap();
    let mut read = 0;
    while let Some(event) = reader.next_event().unwrap() {
        let EventKind::Alloc(alloc) = event.kind else { panic!("not an allocation") };
        let written: Vec<u64> = stacks[read].iter().rev().copied().collect();
        assert_eq!(alloc.backtrace, &written[..], "allocation {read}");
        for &code in alloc.backtrace {
            assert_eq!(event.locations.get(code).unwrap(), &locations_of(code)[..], "{code:#x}");
        }
        read += 1;
    }
    assert_eq!(read, stacks.len());
    assert!(reader.warnings().is_empty());
}
