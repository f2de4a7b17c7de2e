//! Heap profiles of the running program, on demand: [`profile`] and [`profile_delta`] take
//! one from the running session's writer (see `live_profile`), and [`Profile`] encodes it as
//! pprof or folded stacks. (`serve::routes` answers the HTTP requests for them.)

use std::borrow::Cow;
use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::live_profile::{Figures, Mailbox, NoSnapshot, Snapshot, StackFigures, FOLDED_STACK_ID};
use super::session;
use crate::format::hash::FastMap;
use crate::format::location_codec::Location;
use crate::format::pprof::{Line, PprofWriter};
use crate::frames::kept_frames;
use crate::naming::{function_names, profile_name, Spelt};

/// Bytes a word stands for: sample points are drawn per 8-byte word allocated.
const WORD_BYTES: f64 = 8.0;
/// How long a request waits for the writer to answer: it answers between rounds of messages,
/// which naming the frames of a large program's first samples can make seconds long.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest delta profile: a request for more is refused.
pub const MAX_DELTA: Duration = Duration::from_secs(600);

/// Go's heap-profile sample types, in value order: the allocated figures, then the live ones.
const SAMPLE_TYPES: [(&str, &str); 4] =
    [("alloc_objects", "count"), ("alloc_space", "bytes"), ("inuse_objects", "count"), ("inuse_space", "bytes")];
/// How many of a heap profile's values are allocated figures.
const ALLOCATED_VALUES: usize = 2;
/// The sample types of a peak profile.
const PEAK_SAMPLE_TYPES: [(&str, &str); 2] = [("inuse_objects", "count"), ("inuse_space", "bytes")];

/// Which heap profile to take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProfileKind {
    /// What is live now, and what was allocated since the session started (Go's
    /// `/debug/pprof/heap`): sample types `alloc_objects`, `alloc_space`, `inuse_objects`,
    /// `inuse_space`, shown by `inuse_space`.
    Heap,
    /// The same profile as [`ProfileKind::Heap`] shown by `alloc_space` (Go's
    /// `/debug/pprof/allocs`). Of the stacks with nothing live, the 8 192 sampled last keep
    /// their own figures; older ones share one `<stacks folded: …>` pseudo-stack (file
    /// `<memtrace>`), so that the session's memory stays bounded and totals stay exact.
    Allocs,
    /// What was live when the live heap was at its highest so far (tcmalloc's peak-heap
    /// profile; within 1/1024 of the highest, which spares the writer a copy of every stack's
    /// figures each time a heap near its high rises again): sample types `inuse_objects` and
    /// `inuse_space`.
    Peak,
}

impl ProfileKind {
    fn sample_types(self) -> &'static [(&'static str, &'static str)] {
        match self {
            ProfileKind::Heap | ProfileKind::Allocs => &SAMPLE_TYPES,
            ProfileKind::Peak => &PEAK_SAMPLE_TYPES,
        }
    }

    fn default_sample_type(self) -> &'static str {
        match self {
            ProfileKind::Allocs => "alloc_space",
            ProfileKind::Heap | ProfileKind::Peak => "inuse_space",
        }
    }
}

/// Why no profile was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProfileError {
    /// No session is running in this process.
    NotRunning,
    /// The session ended before its profile was taken.
    Ended,
    /// Too many profiles are being taken at once, or the writer did not answer in time.
    Busy,
    /// A delta of a [`ProfileKind::Peak`] profile, or over more than [`MAX_DELTA`].
    InvalidDelta,
}

impl fmt::Display for ProfileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ProfileError::NotRunning => "no memtrace session is running",
            ProfileError::Ended => "the memtrace session ended before the profile was taken",
            ProfileError::Busy => "the memtrace writer is busy: too many profiles at once, or no answer in time",
            ProfileError::InvalidDelta => "a delta profile is of heap or allocs, over at most 600 seconds",
        })
    }
}

impl std::error::Error for ProfileError {}

impl From<NoSnapshot> for ProfileError {
    fn from(e: NoSnapshot) -> ProfileError {
        match e {
            NoSnapshot::Ended => ProfileError::Ended,
            NoSnapshot::Busy => ProfileError::Busy,
        }
    }
}

/// A heap profile of the running program: estimates from its sampled allocations, by stack.
/// Encode it with [`Profile::pprof`] or [`Profile::folded`].
#[derive(Clone)]
pub struct Profile {
    kind: ProfileKind,
    rate: f64,
    /// When it was taken and the time it covers.
    time: SystemTime,
    duration: Duration,
    /// Each stack's values, one per sample type of `kind`.
    stacks: Vec<(StackFigures, Vec<f64>)>,
}

impl fmt::Debug for Profile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Profile").field("kind", &self.kind).field("stacks", &self.stacks.len()).finish()
    }
}

/// Take a profile of the running session (one started with [`crate::start_tracing`] or
/// [`crate::trace_if_requested`], with a trace file or for profiles only). The session's
/// writer builds it between two rounds of samples; no application thread waits for it.
///
/// ```no_run
/// let heap = memtrace_rs::profile(memtrace_rs::ProfileKind::Heap)?;
/// std::fs::write("heap.pb.gz", heap.pprof())?; // go tool pprof -top heap.pb.gz
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn profile(kind: ProfileKind) -> Result<Profile, ProfileError> {
    profile_from(&session::profile_mailbox().ok_or(ProfileError::NotRunning)?, kind)
}

/// What was allocated (and the change of what is live) during the next `over`, not the last:
/// two profiles `over` apart, subtracted (Go's `heap?seconds=N`); this waits `over`. `kind` is
/// [`ProfileKind::Heap`] or [`ProfileKind::Allocs`], `over` at most [`MAX_DELTA`].
pub fn profile_delta(kind: ProfileKind, over: Duration) -> Result<Profile, ProfileError> {
    let mailbox = session::profile_mailbox().ok_or(ProfileError::NotRunning)?;
    delta(&mailbox, kind, over, || sleep(over))
}

/// Wait out `over` (never interrupted): the `wait` of [`delta`] outside the built-in
/// endpoint.
pub(crate) fn sleep(over: Duration) -> bool {
    std::thread::sleep(over);
    true
}

/// The delta profile of `kind` over `over` from the writer of `mailbox`, `wait` waiting `over`
/// (false: it was interrupted, the session ends).
pub(crate) fn delta(
    mailbox: &Mailbox,
    kind: ProfileKind,
    over: Duration,
    wait: impl FnOnce() -> bool,
) -> Result<Profile, ProfileError> {
    if kind == ProfileKind::Peak || over > MAX_DELTA {
        return Err(ProfileError::InvalidDelta);
    }
    let before = mailbox.snapshot(ANSWER_TIMEOUT)?;
    if !wait() {
        return Err(ProfileError::Ended);
    }
    let after = mailbox.snapshot(ANSWER_TIMEOUT)?;
    Ok(Profile::between(kind, &before, &after))
}

/// A mailbox's profile of `kind` (the built-in endpoint's).
pub(crate) fn profile_from(mailbox: &Mailbox, kind: ProfileKind) -> Result<Profile, ProfileError> {
    Ok(Profile::of(kind, &mailbox.snapshot(ANSWER_TIMEOUT)?))
}

impl Profile {
    fn of(kind: ProfileKind, snapshot: &Snapshot) -> Profile {
        let bytes = |f: Figures| f.samples as f64 * WORD_BYTES / snapshot.rate;
        let stacks = snapshot
            .stacks
            .iter()
            .map(|stack| {
                let values = match kind {
                    ProfileKind::Heap | ProfileKind::Allocs => {
                        vec![stack.allocated.objects, bytes(stack.allocated), stack.live.objects, bytes(stack.live)]
                    }
                    ProfileKind::Peak => vec![stack.at_peak.objects, bytes(stack.at_peak)],
                };
                (stack.clone(), values)
            })
            .filter(|(_, values)| values.iter().any(|&v| v != 0.0))
            .collect();
        let time = match kind {
            ProfileKind::Peak => snapshot.peak_at.unwrap_or(snapshot.taken),
            ProfileKind::Heap | ProfileKind::Allocs => snapshot.taken,
        };
        let duration = time.duration_since(snapshot.started).unwrap_or_default();
        Profile { kind, rate: snapshot.rate, time, duration, stacks }
    }

    /// The profile of `kind` (heap or allocs) of what changed from `before` to `after`.
    fn between(kind: ProfileKind, before: &Snapshot, after: &Snapshot) -> Profile {
        let mut profile = Profile::of(kind, after);
        let mut earlier: FastMap<u64, (StackFigures, Vec<f64>)> =
            Profile::of(kind, before).stacks.into_iter().map(|(stack, values)| (stack.id, (stack, values))).collect();
        for (stack, values) in &mut profile.stacks {
            if let Some((_, earlier)) = earlier.remove(&stack.id) {
                values.iter_mut().zip(earlier).for_each(|(v, e)| *v -= e);
            }
        }
        // The stacks left were folded meanwhile: what they had allocated before is in the
        // folded stack's growth, and what was live of them is not any more.
        let mut allocated_before = [0.0; ALLOCATED_VALUES];
        for (stack, mut values) in earlier.into_values() {
            for (before, value) in allocated_before.iter_mut().zip(&mut values[..ALLOCATED_VALUES]) {
                *before += std::mem::take(value);
            }
            values[ALLOCATED_VALUES..].iter_mut().for_each(|v| *v = -*v);
            profile.stacks.push((stack, values));
        }
        if let Some((_, values)) = profile.stacks.iter_mut().find(|(stack, _)| stack.id == FOLDED_STACK_ID) {
            values.iter_mut().zip(allocated_before).for_each(|(v, before)| *v -= before);
        }
        profile.stacks.retain(|(_, values)| values.iter().any(|&v| v != 0.0));
        profile.duration = after.taken.duration_since(before.taken).unwrap_or_default();
        profile
    }

    /// Which profile this is.
    pub fn kind(&self) -> ProfileKind {
        self.kind
    }

    /// The profile as a gzipped pprof protobuf, in the convention of Go's heap profiles:
    /// what `go tool pprof`, Grafana Pyroscope and Parca read. Each stack is a sample, leaf
    /// first, without the allocator frames at its leaf and the start-up frames at its root
    /// (as `memtrace pprof` trims them), with span and thread frames at its root; values are
    /// estimates, rounded.
    pub fn pprof(&self) -> Vec<u8> {
        let executable = std::env::current_exe().map(|p| p.into_os_string().into_encoded_bytes()).unwrap_or_default();
        let period = (WORD_BYTES / self.rate).round() as i64;
        let mut out = PprofWriter::new(
            self.kind.sample_types(),
            self.kind.default_sample_type(),
            ("space", "bytes"),
            period,
            &executable,
        );
        let names = Names::of(&self.stacks);
        let (mut kept, mut locations, mut values) = (Vec::new(), Vec::new(), Vec::new());
        for (stack, figures) in &self.stacks {
            let frames = names.frames(stack);
            kept.clear();
            kept.extend(kept_of(&frames));
            locations.clear();
            // One location per frame address: its kept inlined functions, innermost first.
            for run in kept.chunk_by(|&a, &b| frames[a].code == frames[b].code) {
                locations.push(out.location(run.iter().map(|&i| {
                    let location = frames[i].location;
                    Line { function: frames[i].shown.as_bytes(), file: &location.filename, line: location.line }
                })));
            }
            values.clear();
            values.extend(figures.iter().map(|&v| v.round() as i64));
            out.sample(&locations, &values);
        }
        let nanos = |d: Duration| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX);
        let comment = format!("memtrace: estimated from sampled allocations (sample rate {:e})", self.rate);
        out.finish(nanos(self.time.duration_since(UNIX_EPOCH).unwrap_or_default()), nanos(self.duration), &[&comment])
    }

    /// The profile as folded stacks (`frame;frame;frame value` lines, root first), the input
    /// of flame graph tools (inferno, flamegraph.pl, speedscope), by the default sample type
    /// (`inuse_space`, or `alloc_space` for [`ProfileKind::Allocs`]) in bytes. Stacks are
    /// trimmed as in [`Profile::pprof`]; stacks of zero bytes are left out.
    pub fn folded(&self) -> String {
        let index = self.kind.sample_types().iter().position(|(t, _)| *t == self.kind.default_sample_type());
        let index = index.expect("the default sample type is one of the kind's");
        let names = Names::of(&self.stacks);
        let mut out = String::new();
        for (stack, figures) in &self.stacks {
            let value = figures[index].round() as i64;
            if value == 0 {
                continue;
            }
            let frames = names.frames(stack);
            let kept: Vec<usize> = kept_of(&frames).collect();
            for (n, &i) in kept.iter().rev().enumerate() {
                if n > 0 {
                    out.push(';');
                }
                // A `;` would split the frame.
                out.push_str(&frames[i].shown.replace(';', ","));
            }
            out.push_str(&format!(" {value}\n"));
        }
        out
    }
}

/// One frame of a stack: a function of a location code's inlined functions.
struct Frame<'a> {
    code: usize,
    location: &'a Location,
    /// Its function's name (`naming::function_names`), which trimming reads.
    function: &'a str,
    file: Cow<'a, str>,
    /// Its name in the profile (`naming::profile_name`).
    shown: &'a str,
}

/// The names of the frames of a profile's stacks, made once for all of them by the rules
/// every output follows (`crate::naming`).
struct Names<'a> {
    /// Each distinct frame's number, by its location.
    numbers: FastMap<&'a Location, usize>,
    /// By number: the function names, and the names in the profile.
    functions: Vec<String>,
    shown: Vec<String>,
}

impl<'a> Names<'a> {
    fn of(stacks: &'a [(StackFigures, Vec<f64>)]) -> Names<'a> {
        let mut numbers = FastMap::default();
        let mut spelt = Vec::new();
        for location in stacks.iter().flat_map(|(stack, _)| stack.frames.iter().flat_map(|code| code.iter())) {
            numbers.entry(location).or_insert_with(|| {
                spelt.push((location.defname_str(), location.filename_str(), location.line));
                spelt.len() - 1
            });
        }
        let frames: Vec<Spelt<'_>> =
            spelt.iter().map(|(function, file, line)| Spelt { function, file, line: *line }).collect();
        let functions = function_names(&frames);
        let shown = functions.iter().zip(&frames).map(|(f, s)| profile_name(f, s.file, s.line).into_owned()).collect();
        Names { numbers, functions, shown }
    }

    /// The frames of `stack` (one of those the names were made of), innermost first (a code's
    /// inlined functions innermost first).
    fn frames<'s>(&'s self, stack: &'s StackFigures) -> Vec<Frame<'s>> {
        let mut frames = Vec::new();
        for (code, locations) in stack.frames.iter().enumerate() {
            for location in locations.iter().rev() {
                let n = self.numbers[location];
                frames.push(Frame {
                    code,
                    location,
                    function: &self.functions[n],
                    file: location.filename_str(),
                    shown: &self.shown[n],
                });
            }
        }
        frames
    }
}

/// The indexes of the kept `frames`, innermost first.
fn kept_of<'a>(frames: &'a [Frame<'a>]) -> impl Iterator<Item = usize> + 'a {
    kept_frames(frames.len(), false, false, |i| (frames[i].function, &frames[i].file[..]))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::runtime::live_profile::tests::named;
    use crate::runtime::live_profile::{CodeLocations, LiveProfile};

    /// The values of the stacks whose innermost function is `function`, summed.
    fn values_of(profile: &Profile, function: &str) -> Vec<f64> {
        let mut sum = vec![0.0; profile.kind.sample_types().len()];
        for (stack, values) in &profile.stacks {
            if stack.frames[0][0].defname_str().starts_with(function) {
                sum.iter_mut().zip(values).for_each(|(s, v)| *s += v);
            }
        }
        sum
    }

    /// A protobuf message's length-delimited fields: (field number, bytes), in order.
    fn delimited_fields(mut message: &[u8]) -> Vec<(u64, &[u8])> {
        fn varint(bytes: &mut &[u8]) -> u64 {
            let (mut v, mut shift) = (0, 0);
            loop {
                let byte = bytes[0];
                *bytes = &bytes[1..];
                v |= u64::from(byte & 0x7f) << shift;
                if byte < 0x80 {
                    return v;
                }
                shift += 7;
            }
        }
        let mut fields = Vec::new();
        while !message.is_empty() {
            let tag = varint(&mut message);
            match tag & 7 {
                0 => drop(varint(&mut message)),
                2 => {
                    let len = varint(&mut message) as usize;
                    fields.push((tag >> 3, &message[..len]));
                    message = &message[len..];
                }
                wire => panic!("wire type {wire}"),
            }
        }
        fields
    }

    /// A frame's inlined functions are the lines of one pprof location (as Go's profiles
    /// have them), not a location each.
    #[test]
    fn inlined_functions_share_their_frames_location() {
        let mut p = LiveProfile::new(1.0);
        let inlined = |code: u64| match code {
            1 => {
                let line = |name: &[u8]| Location {
                    filename: b"f.rs"[..].into(),
                    line: 1,
                    start_char: 0,
                    end_char: 0,
                    defname: name.into(),
                };
                // Outermost first: `outer` had `inner` inlined into it.
                Arc::new([line(b"outer"), line(b"inner")]) as CodeLocations
            }
            code => named(code),
        };
        p.alloc(0x10, 1, 1, &[1, 2], inlined);
        let gz = Profile::of(ProfileKind::Heap, &p.snapshot()).pprof();
        let raw = miniz_oxide::inflate::decompress_to_vec(&gz[10..gz.len() - 8]).unwrap();
        let lines_by_location: Vec<usize> = delimited_fields(&raw)
            .into_iter()
            .filter(|&(field, _)| field == 4)
            .map(|(_, location)| delimited_fields(location).iter().filter(|&&(field, _)| field == 4).count())
            .collect();
        assert_eq!(lines_by_location, [2, 1]);
    }

    /// A delta over a time when stacks were folded counts what was allocated in it, neither
    /// more (the folded stacks' totals from before) nor less, and what stopped being live.
    #[test]
    fn a_delta_across_folded_stacks_counts_what_the_time_allocated() {
        let mut p = LiveProfile::with_idle_budget(1.0, 1);
        p.alloc(0x10, 1, 10, &[1], named);
        p.alloc(0x20, 1, 5, &[2], named);
        p.free(0x20);
        let before = p.snapshot();
        // In the time: `f1` allocates 3 more and frees all, `f3` allocates 7; `f2`, then `f1`, are
        // folded.
        p.alloc(0x30, 1, 3, &[1], named);
        p.free(0x30);
        p.free(0x10);
        p.alloc(0x40, 1, 7, &[3], named);
        p.free(0x40);
        let after = p.snapshot();
        let delta = Profile::between(ProfileKind::Allocs, &before, &after);
        assert_eq!(values_of(&delta, "f3"), [7.0, 56.0, 0.0, 0.0]);
        assert_eq!(values_of(&delta, "<stacks folded: allocated totals of 2 stacks"), [3.0, 24.0, 0.0, 0.0]);
        assert_eq!(values_of(&delta, "f1"), [0.0, 0.0, -10.0, -80.0]);
        assert_eq!(values_of(&delta, "f2"), [0.0; 4]);
        assert_eq!(delta.stacks.len(), 3);
    }
}
