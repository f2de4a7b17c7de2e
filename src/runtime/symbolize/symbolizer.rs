//! The symbolizer's state: the objects of the process and their parsed debug info, answers
//! cached per address, and the memory budget that bounds them.
//!
//! A [`Symbolizer`] is owned by one thread (the writer thread, or calibration) and holds every
//! piece of its state itself: no process-wide lock, so a forked child that makes a new
//! `Symbolizer` works whatever its parent's threads were doing at the fork. A thread that
//! helps it name addresses ([`Symbolizer::lend`]) parses what they need with a reader of its
//! own, which shares only the object's mapped files.
//!
//! * Objects come from `dl_iterate_phdr` ([`loaded_objects`](super::loaded_objects)). The list
//!   is scanned again when the loader's `dlpi_adds`/`dlpi_subs` counters moved (a `dlopen` or
//!   `dlclose` happened), checked on every call. Objects are keyed by (path, load bias,
//!   build-id, or device+inode where there is no build-id); an object that is gone takes its
//!   cached answers with it, so code loaded later at the same addresses gets its own names,
//!   but is kept aside ([`MAX_UNLOADED`] of the last): an address that no loaded object holds
//!   is looked up there, so that a library unloaded right after its frames were sampled
//!   (a plugin called once and closed) still names them when the writer gets to them.
//! * An object's file is parsed ([`object_file`]) the first time an
//!   address in it is asked for, or before, when the writer gets ready for its first sample
//!   ([`Symbolizer::prepare`]: the program's and the C library's).
//! * Parsed state is estimated and kept under [`Options::memory_budget`] by dropping the parsed
//!   state of idle objects, least recently used first, then the current object's parsed units,
//!   then the answer cache (see [`Symbolizer::enforce_budget`]). Not counted: the mapped files
//!   (their pages are file-backed and reclaimable) and the base state of the object in use.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;

use super::lending::Lent;
use super::loaded_objects::scan_objects;
use super::object_file::{self, Loaded, RawFrame};
use crate::format::hash::{FastMap, FastSet};
use crate::runtime::loader;

/// The functions at an address, outermost first; `None` when nothing is known.
pub type Answer = Option<Arc<[Frame]>>;

/// How a [`Symbolizer`] behaves.
#[derive(Clone, Debug)]
pub struct Options {
    /// Bytes of parsed state (inflated sections, symbol tables, parsed units, cached answers)
    /// to keep, beyond the mapped files and the base state of the object in use (its symbol
    /// table and DWARF unit index, which any address in it needs). Approximate: parsed units
    /// are estimated from what is kept of them.
    pub memory_budget: usize,
    /// Look for separate debug files (`<debug_dir>/.build-id/xx/yyyy.debug`, then
    /// `.gnu_debuglink` beside the object, in its `.debug/` and under `<debug_dir>`) for objects
    /// without DWARF of their own. Off by default: distribution debug files are compressed, and
    /// inflating libc's costs tens of milliseconds and megabytes.
    pub separate_debug_files: bool,
    /// The global debug directory.
    pub debug_dir: PathBuf,
}

impl Default for Options {
    fn default() -> Options {
        Options { memory_budget: 8 << 20, separate_debug_files: false, debug_dir: PathBuf::from("/usr/lib/debug") }
    }
}

/// One function at an address: the function containing the code, or one inlined into it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Frame {
    /// Demangled name, without hash.
    pub function: Option<Arc<str>>,
    /// Source file path, as the debug info gives it (joined with the compilation directory).
    pub file: Option<Arc<str>>,
    /// 0 when unknown.
    pub line: u32,
    /// 0 when unknown.
    pub column: u32,
}

/// Counters, for tests and diagnostics.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    /// Scans of the loaded objects (`dl_iterate_phdr`).
    pub scans: u64,
    /// Objects whose file was mapped and parsed (again, after an eviction).
    pub loads: u64,
    /// Objects' parsed state dropped to stay under the budget.
    pub evictions: u64,
    /// Objects forgotten because they were unloaded.
    pub unloaded: u64,
    /// Answers served from the cache.
    pub cache_hits: u64,
    /// Estimated bytes of parsed state now held.
    pub estimated_bytes: usize,
    /// Of which the base state of the object last used, which the budget does not count.
    pub base_bytes: usize,
}

/// Symbolizes addresses of the current process. Owned by one thread; `Send`, not `Sync`.
pub struct Symbolizer {
    options: Options,
    /// The loaded objects (in the loader's order, the program first), then those unloaded
    /// since they were seen, most recently unloaded first.
    objects: Vec<Object>,
    /// How many of `objects` are loaded.
    loaded: usize,
    /// (start, end, index into `objects`) of every `PT_LOAD` segment of the loaded objects,
    /// sorted by start.
    ranges: Vec<(u64, u64, usize)>,
    /// `dlpi_adds`/`dlpi_subs` at the last scan; `None` when the loader lacks them.
    counters: Option<(u64, u64)>,
    scanned: bool,
    next_id: u64,
    clock: u64,
    /// Address -> (object id, answer). Only addresses inside a known object are cached.
    cache: FastMap<u64, (u64, Answer)>,
    cache_bytes: usize,
    strings: FastSet<Arc<str>>,
    stats: Stats,
    /// A note that the program's frames miss names (see [`Symbolizer::take_program_note`]),
    /// not said yet; once said, `Some(None)`.
    program_note: Option<Option<String>>,
}

impl Default for Symbolizer {
    fn default() -> Self {
        Symbolizer::new()
    }
}

impl Symbolizer {
    /// A symbolizer with default [`Options`]. Does no work until the first address.
    pub fn new() -> Symbolizer {
        Symbolizer::with_options(Options::default())
    }

    /// A symbolizer with `options`. Does no work until the first address.
    pub fn with_options(options: Options) -> Symbolizer {
        Symbolizer {
            options,
            objects: Vec::new(),
            loaded: 0,
            ranges: Vec::new(),
            counters: None,
            scanned: false,
            next_id: 1,
            clock: 0,
            cache: FastMap::default(),
            cache_bytes: 0,
            strings: FastSet::default(),
            stats: Stats::default(),
            program_note: None,
        }
    }

    /// Change the options; the budget is enforced from the next address on.
    pub fn set_options(&mut self, options: Options) {
        self.options = options;
    }

    fn clear_answers(&mut self) {
        self.cache.clear();
        self.cache_bytes = 0;
        self.strings.clear();
    }

    /// Once, if the program has no debug info or no symbol table: a note for its user that
    /// says what its frames are named without, and what gives full names.
    pub(crate) fn take_program_note(&mut self) -> Option<String> {
        self.program_note.as_mut().and_then(Option::take)
    }

    /// What it did so far, and the memory it holds now.
    pub fn stats(&self) -> Stats {
        let base_bytes = self.objects.iter().max_by_key(|o| o.last_use).map_or(0, |o| match &o.state {
            State::Loaded(l) => l.base_bytes(),
            _ => 0,
        });
        Stats { estimated_bytes: self.estimated_bytes(), base_bytes, ..self.stats.clone() }
    }

    /// Give back, in every object, what lookups made resident: parsed DWARF units and the
    /// pages of mapped files (symbol tables and unit indexes are kept). For a while without
    /// addresses to name: the next lookup in an object reads its unit again.
    pub(crate) fn release(&mut self) {
        for object in &mut self.objects {
            if let State::Loaded(loaded) = &mut object.state {
                loaded.release();
            }
        }
    }

    /// The functions at return address `return_address` (the code looked up is the call
    /// instruction, at `return_address - 1`), outermost first. `None` when nothing is known.
    pub fn symbolize(&mut self, return_address: u64) -> Answer {
        if return_address == 0 {
            return None;
        }
        self.symbolize_pc(return_address - 1)
    }

    /// Like [`Symbolizer::symbolize`], for the exact address of an instruction.
    pub fn symbolize_pc(&mut self, pc: u64) -> Answer {
        self.clock += 1;
        self.refresh_if_changed();
        if let Some((_, frames)) = self.cache.get(&pc) {
            self.stats.cache_hits += 1;
            return frames.clone();
        }
        let mut index = self.find_object(pc);
        if index.is_none() && self.counters.is_none() {
            // No counters to tell us about new objects: look again.
            self.rescan();
            index = self.find_object(pc);
        }
        let index = index?;
        let frames = self.lookup_in(index, pc);
        // An unloaded object's answers are not kept: another object may be loaded there next.
        if index < self.loaded {
            let id = self.objects[index].id;
            self.cache_bytes += 64 + frames.as_ref().map_or(0, |f| f.len() * std::mem::size_of::<Frame>());
            self.cache.insert(pc, (id, frames.clone()));
        }
        self.enforce_budget(index);
        frames
    }

    /// Get ready to look up `return_addresses` (a batch about to be asked for): objects
    /// opened now look them up in one pass over their symbol table and unit index rather
    /// than sorted copies, for their first few batches (see `Loaded::expect`).
    pub fn expect(&mut self, return_addresses: &[u64]) {
        self.refresh_if_changed();
        let mut located: Vec<(usize, u64)> = return_addresses
            .iter()
            .filter_map(|&ra| ra.checked_sub(1))
            .filter(|pc| !self.cache.contains_key(pc))
            .filter_map(|pc| Some((self.find_object(pc)?, pc)))
            .collect();
        located.sort_unstable();
        for objects in located.chunk_by(|a, b| a.0 == b.0) {
            let index = objects[0].0;
            self.load(index);
            let object = &mut self.objects[index];
            if let State::Loaded(loaded) = &mut object.state {
                let probes: Vec<u64> = objects.iter().map(|&(_, pc)| pc.wrapping_sub(object.base)).collect();
                loaded.expect(&probes);
            }
        }
    }

    /// The names of the function symbols containing the code at each of `return_addresses`,
    /// from the objects' symbol tables alone (no DWARF is parsed, no inlined function is seen,
    /// nothing is cached): cheap enough for start-up. An object not yet opened is read in one
    /// pass over its symbol table for all its addresses, and left unopened: its sorted table
    /// is built by the first lookup that needs it.
    pub fn symbol_names(&mut self, return_addresses: &[u64]) -> Vec<Option<String>> {
        self.refresh_if_changed();
        let located: Vec<Option<(usize, u64)>> = return_addresses
            .iter()
            .map(|&ra| ra.checked_sub(1).and_then(|pc| Some((self.find_object(pc)?, pc))))
            .collect();
        let mut indexes: Vec<usize> = located.iter().flatten().map(|&(index, _)| index).collect();
        indexes.sort_unstable();
        indexes.dedup();
        let mut names = vec![None; return_addresses.len()];
        for index in indexes {
            let object = &mut self.objects[index];
            let (at, probes): (Vec<usize>, Vec<u64>) = located
                .iter()
                .enumerate()
                .filter_map(|(k, l)| l.filter(|&(i, _)| i == index).map(|(_, pc)| (k, pc.wrapping_sub(object.base))))
                .unzip();
            let found = match &mut object.state {
                State::Loaded(loaded) => loaded.symbol_names(&probes),
                State::NotLoaded => object_file::symbol_names(&object.path, object.build_id.as_deref(), &probes),
                State::Failed => continue,
            };
            for (k, name) in at.into_iter().zip(found) {
                names[k] = name;
            }
        }
        names
    }

    /// For each of `return_addresses`, whether its code is in the loaded object that holds
    /// the code at return address `of`.
    pub fn in_object_of(&mut self, return_addresses: &[u64], of: u64) -> Vec<bool> {
        self.refresh_if_changed();
        let object = |pc: u64| pc.checked_sub(1).and_then(|pc| self.find_object(pc));
        let wanted = object(of);
        return_addresses.iter().map(|&ra| wanted.is_some() && object(ra) == wanted).collect()
    }

    /// A name for the code at `return_address` that no symbol names: the file name of the
    /// object holding it and the address's offset in that object as linked
    /// (`libc.so.6+0x2724a`), which is the same in every run whatever the load address and is
    /// what `addr2line -e OBJECT` takes; with the object's path and, where it has one, its
    /// build-id, which tell the file to symbolize it with later. `None` outside every object.
    pub fn place_in_object(&mut self, return_address: u64) -> Option<(String, String)> {
        self.refresh_if_changed();
        let object = &self.objects[self.find_object(return_address.checked_sub(1)?)?];
        Some(object_place(&object.path, object.build_id.as_deref(), return_address.wrapping_sub(object.base)))
    }

    fn estimated_bytes(&self) -> usize {
        let strings: usize = self.strings.iter().map(|s| s.len() + 48).sum();
        self.objects.iter().map(|o| o.state.bytes()).sum::<usize>() + self.cache_bytes + strings
    }

    /// The object holding `pc`: a loaded one, else the one unloaded most recently that held it.
    fn find_object(&self, pc: u64) -> Option<usize> {
        let loaded = self.ranges.partition_point(|r| r.0 <= pc).checked_sub(1).and_then(|i| {
            let (start, end, index) = self.ranges[i];
            (start <= pc && pc < end).then_some(index)
        });
        loaded.or_else(|| {
            let mut unloaded = self.objects.iter().enumerate().skip(self.loaded);
            unloaded.find(|(_, o)| o.segments.iter().any(|&(start, end)| start <= pc && pc < end)).map(|(i, _)| i)
        })
    }

    /// Get ready for a first address before it comes: list the loaded objects and open those
    /// that hold a thread's outermost frames, and most of its others: the program (the loader
    /// lists it first) and the C library.
    pub(crate) fn prepare(&mut self) {
        self.refresh_if_changed();
        let program = (!self.objects.is_empty()).then_some(0);
        // (In a program that is not position-independent, `exit`'s address is its own.)
        let c_library = self.find_object(libc::exit as *const () as u64);
        for index in [program, c_library].into_iter().flatten() {
            self.load(index);
        }
        // The search of a unit's entries (memchr's) probes the CPU's features on its first call:
        // tens of µs in a virtual machine, where each probe traps.
        #[cfg(target_arch = "x86_64")]
        std::hint::black_box(std::is_x86_feature_detected!("avx2"));
    }

    fn refresh_if_changed(&mut self) {
        if !self.scanned {
            self.rescan();
            return;
        }
        if let Some(counters) = self.counters {
            if loader::counters() != Some(counters) {
                self.rescan();
            }
        }
    }

    fn rescan(&mut self) {
        self.stats.scans += 1;
        self.scanned = true;
        let (scanned, counters) = scan_objects();
        self.counters = counters;
        let mut old: HashMap<Key, Object> = self.objects.drain(..).map(|o| (o.key.clone(), o)).collect();
        for s in scanned {
            let key = Key { path: s.path.clone(), base: s.base, build_id: s.build_id.clone(), file: s.file_id };
            let object = old.remove(&key).unwrap_or_else(|| {
                let id = self.next_id;
                self.next_id += 1;
                Object {
                    id,
                    key,
                    base: s.base,
                    path: s.path,
                    build_id: s.build_id,
                    segments: s.segments,
                    state: State::NotLoaded,
                    last_use: 0,
                    unloaded_at: None,
                }
            });
            // Loaded again (the same file at the same address).
            let object = Object { unloaded_at: None, ..object };
            self.objects.push(object);
        }
        self.loaded = self.objects.len();
        // The objects unloaded before, in their order, after those unloaded now.
        let mut before: Vec<Object> = Vec::new();
        let mut now: Vec<Object> = Vec::new();
        for object in old.into_values() {
            if object.unloaded_at.is_some() {
                before.push(object);
            } else {
                now.push(object);
            }
        }
        if !now.is_empty() {
            // Unloaded: forget their answers, so that whatever is loaded at their addresses next
            // is looked up afresh.
            self.stats.unloaded += now.len() as u64;
            let gone: HashSet<u64> = now.iter().map(|o| o.id).collect();
            self.cache.retain(|_, (id, _)| !gone.contains(id));
            self.cache_bytes = self
                .cache
                .values()
                .map(|(_, f)| 64 + f.as_ref().map_or(0, |f| f.len() * std::mem::size_of::<Frame>()))
                .sum();
        }
        let scan = self.stats.scans;
        now.iter_mut().for_each(|o| o.unloaded_at = Some(scan));
        before.sort_by_key(|o| std::cmp::Reverse(o.unloaded_at));
        self.objects.extend(now.into_iter().chain(before).take(MAX_UNLOADED));
        self.ranges = self.objects[..self.loaded]
            .iter()
            .enumerate()
            .flat_map(|(i, o)| o.segments.iter().map(move |&(start, end)| (start, end, i)))
            .collect();
        self.ranges.sort_unstable();
    }

    /// Object `index`'s state, its file opened (symbols read, DWARF not yet parsed) if it was
    /// not.
    fn load(&mut self, index: usize) {
        let object = &mut self.objects[index];
        object.last_use = self.clock;
        if matches!(object.state, State::NotLoaded) {
            // A sandbox the program installed may kill the process at an open: its frames stay
            // unnamed instead.
            if crate::runtime::state::under_seccomp_filter() {
                object.state = State::Failed;
                return;
            }
            self.stats.loads += 1;
            object.state = match Loaded::open(&object.path, object.build_id.as_deref(), &self.options) {
                Some(loaded) => State::Loaded(Box::new(loaded)),
                None => State::Failed,
            };
        }
    }

    fn lookup_in(&mut self, index: usize, pc: u64) -> Answer {
        self.load(index);
        let object = &mut self.objects[index];
        let State::Loaded(loaded) = &mut object.state else { return None };
        let raw = loaded.lookup(pc.wrapping_sub(object.base));
        // The loader lists the program first. Asked after each of its lookups until names are
        // found missing: split DWARF shows in the units looked up.
        if index == 0 && self.program_note.is_none() {
            if let Some(missing) = loaded.missing_names() {
                self.program_note = Some(Some(format!("memtrace: note: {} {missing}", object.path.display())));
            }
        }
        let strings = &mut self.strings;
        answer(raw, |s: String| -> Arc<str> {
            if let Some(found) = strings.get(s.as_str()) {
                return found.clone();
            }
            let arc: Arc<str> = s.into();
            strings.insert(arc.clone());
            arc
        })
    }

    /// Lend those of `return_addresses` that are in the object of the first of them not named
    /// yet to another thread, to name some of them while this one names the others ([`Lent`]):
    /// what the object's tables say of each is found now, and the other thread parses the
    /// DWARF they need with a reader of its own. `None` when there is nothing to lend (or the
    /// object's DWARF cannot be shared). The other thread's answers are not cached here.
    pub(crate) fn lend(&mut self, return_addresses: &[u64]) -> Option<Lent> {
        self.refresh_if_changed();
        let located: Vec<(usize, usize, u64)> = return_addresses
            .iter()
            .enumerate()
            .filter_map(|(k, &ra)| Some((k, ra.checked_sub(1)?)))
            .filter(|(_, pc)| !self.cache.contains_key(pc))
            .filter_map(|(k, pc)| Some((k, self.find_object(pc)?, pc)))
            .collect();
        let index = located.first()?.1;
        self.load(index);
        let object = &mut self.objects[index];
        let State::Loaded(loaded) = &mut object.state else { return None };
        let sibling = loaded.sibling()?;
        let found = located
            .iter()
            .filter(|&&(_, i, _)| i == index)
            .map(|&(k, _, pc)| (k, loaded.find(pc.wrapping_sub(object.base))))
            .collect();
        Some(Lent::new(sibling, found))
    }

    /// Over budget, drop (1) other objects' parsed state, least recently used first, once
    /// unused for [`MIN_LOOKUPS_BEFORE_EVICTION`] addresses (the objects of one stack, say the
    /// program and the C library, must not evict each other at every address), (2) the
    /// current object's, when more than one of its units is parsed (the next address then
    /// parses only its own unit), (3) the answer cache. The current object's base state
    /// (its symbol table and unit index) is not counted: any address in the
    /// object needs it.
    fn enforce_budget(&mut self, current: usize) {
        let budget = self.options.memory_budget;
        let base = |objects: &[Object]| match &objects[current].state {
            State::Loaded(l) => l.base_bytes(),
            _ => 0,
        };
        while self.estimated_bytes() - base(&self.objects) > budget {
            let clock = self.clock;
            let victim = self
                .objects
                .iter()
                .enumerate()
                .filter(|(i, o)| {
                    *i != current
                        && matches!(o.state, State::Loaded(_))
                        && clock - o.last_use >= MIN_LOOKUPS_BEFORE_EVICTION
                })
                .min_by_key(|(_, o)| o.last_use)
                .map(|(i, _)| i);
            if let Some(i) = victim {
                self.objects[i].state = State::NotLoaded;
                self.stats.evictions += 1;
                continue;
            }
            if let State::Loaded(l) = &self.objects[current].state {
                if l.parsed_units() > 1 {
                    self.objects[current].state = State::NotLoaded;
                    self.stats.evictions += 1;
                    continue;
                }
            }
            if !self.cache.is_empty() {
                self.clear_answers();
                continue;
            }
            break;
        }
    }
}

/// See [`Symbolizer::enforce_budget`].
const MIN_LOOKUPS_BEFORE_EVICTION: u64 = 256;

/// How many unloaded objects are kept aside to name the frames sampled in them before they
/// were unloaded.
const MAX_UNLOADED: usize = 32;

#[derive(Clone, PartialEq, Eq, Hash, Debug)]
struct Key {
    path: PathBuf,
    base: u64,
    build_id: Option<Vec<u8>>,
    file: Option<(u64, u64)>,
}

struct Object {
    id: u64,
    key: Key,
    base: u64,
    path: PathBuf,
    build_id: Option<Vec<u8>>,
    segments: Vec<(u64, u64)>,
    state: State,
    last_use: u64,
    /// The scan that found it unloaded; `None` while it is loaded.
    unloaded_at: Option<u64>,
}

enum State {
    NotLoaded,
    /// No file, unreadable, or not the file that was loaded.
    Failed,
    Loaded(Box<Loaded>),
}

impl State {
    fn bytes(&self) -> usize {
        match self {
            State::Loaded(l) => l.bytes(),
            _ => 0,
        }
    }
}

/// The name and file [`Symbolizer::place_in_object`] gives an address at `offset` in the
/// object at `path` with `build_id`.
pub(super) fn object_place(path: &std::path::Path, build_id: Option<&[u8]>, offset: u64) -> (String, String) {
    let file_name = path.file_name().unwrap_or(path.as_os_str()).to_string_lossy();
    let mut file = path.to_string_lossy().into_owned();
    if let Some(id) = build_id {
        file.push_str(" build-id ");
        file.extend(id.iter().map(|b| format!("{b:02x}")));
    }
    (format!("{file_name}+{offset:#x}"), file)
}

/// The answer of `raw` frames, their strings made shared by `share`.
pub(super) fn answer(raw: Vec<RawFrame>, mut share: impl FnMut(String) -> Arc<str>) -> Answer {
    if raw.is_empty() {
        return None;
    }
    Some(
        raw.into_iter()
            .map(|r| Frame {
                function: r.function.map(&mut share),
                file: r.file.map(&mut share),
                line: r.line,
                column: r.column,
            })
            .collect(),
    )
}

#[cfg(test)]
pub(super) mod tests {
    use std::os::unix::ffi::OsStrExt;
    use std::path::Path;

    use super::*;

    #[inline(never)]
    fn known_function(x: u64) -> u64 {
        std::hint::black_box(x.wrapping_mul(31).rotate_left(7))
    }

    fn innermost_name(frames: &[Frame]) -> String {
        frames.last().and_then(|f| f.function.as_deref()).unwrap_or("").to_owned()
    }

    #[test]
    fn names_a_function_of_this_test_binary() {
        let mut s = Symbolizer::new();
        let addr = known_function as *const () as usize as u64;
        // Return-address semantics: addr + 1 looks up addr.
        let frames = s.symbolize(addr + 1).expect("no frames");
        // The outermost frame: code at the function's start may be inlined from elsewhere.
        let name = frames[0].function.as_deref().unwrap_or("").to_owned();
        assert!(name.ends_with("tests::known_function"), "{frames:?}");
        assert!(!name.contains("::h"), "hash not stripped: {name}");
        let outer = frames.first().unwrap();
        // Built without debug info (plain release), the name comes from .symtab alone.
        if let Some(file) = outer.file.as_deref() {
            assert!(file.ends_with("symbolize/symbolizer.rs"), "{frames:?}");
            assert!(outer.line > 0);
        }
        // Cached the second time.
        let again = s.symbolize(addr + 1).unwrap();
        assert_eq!(again, frames);
        assert_eq!(s.stats().cache_hits, 1);
        assert_eq!(known_function(1), known_function(1));
    }

    #[test]
    fn unknown_addresses_give_none() {
        let mut s = Symbolizer::new();
        assert_eq!(s.symbolize(0), None);
        assert_eq!(s.symbolize(9), None);
    }

    #[test]
    fn libc_exports_are_named_from_dynsym() {
        // libc.so.6 has no .symtab nor DWARF here; without separate debug files its exported
        // functions come from .dynsym.
        let mut s = Symbolizer::new();
        let addr = libc::getpid as *const () as usize as u64;
        let frames = s.symbolize_pc(addr).expect("getpid not named");
        let name = innermost_name(&frames);
        assert!(name.contains("getpid"), "{frames:?}");
    }

    #[test]
    fn a_forked_child_can_symbolize() {
        let mut parent = Symbolizer::new();
        parent.symbolize(known_function as *const () as usize as u64 + 1).unwrap();
        // SAFETY: the child only symbolizes (allocating, which glibc allows after a fork of a
        // multi-threaded process) and exits with `_exit`.
        unsafe {
            let pid = libc::fork();
            if pid == 0 {
                let mut child = Symbolizer::new();
                let ok = child.symbolize(known_function as *const () as usize as u64 + 1).is_some();
                libc::_exit(if ok { 0 } else { 1 });
            }
            let mut status = 0;
            libc::waitpid(pid, &mut status, 0);
            assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "child failed: {status}");
        }
    }

    #[test]
    fn the_budget_is_honoured() {
        const BUDGET: usize = 256 << 10;
        let mut s = Symbolizer::with_options(Options { memory_budget: BUDGET, ..Options::default() });
        let a = known_function as *const () as usize as u64;
        let b = libc::getpid as *const () as usize as u64;
        // This test binary's DWARF does not fit the budget; libc's symbols do.
        assert!(s.symbolize(a + 1).is_some());
        assert!(s.symbolize_pc(b).is_some());
        assert_eq!(s.stats().evictions, 0, "recently used objects are kept: {:?}", s.stats());
        for _ in 0..MIN_LOOKUPS_BEFORE_EVICTION {
            assert!(s.symbolize_pc(b).is_some());
        }
        // A new address of libc's: the test binary, idle since, is dropped.
        assert!(s.symbolize_pc(libc::getppid as *const () as usize as u64).is_some());
        let stats = s.stats();
        assert!(stats.evictions == 1 && stats.estimated_bytes <= BUDGET, "{stats:?}");
        // Answers survive in the cache while it fits; the test binary is parsed again when asked.
        let hits = stats.cache_hits;
        s.symbolize_pc(b);
        assert_eq!(s.stats().cache_hits, hits + 1);
        assert!(s.symbolize(a + 1).is_some());
        assert_eq!(s.stats().loads, 3, "{:?}", s.stats());
    }

    /// A fresh directory for the files of the test `name`.
    fn scratch_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("symbolizer-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// Says that a test is skipped for want of a C compiler: a failure under CI, which has one.
    pub(in crate::runtime::symbolize) fn skip_without_compiler() {
        crate::test_skip::skip("no C compiler (apt-get install gcc)");
    }

    /// Builds `lib<name>.so` exporting `fn_name` in `dir`; `None` when there is no C compiler
    /// (see [`skip_without_compiler`]).
    pub(in crate::runtime::symbolize) fn build_so(dir: &Path, name: &str, fn_name: &str) -> Option<PathBuf> {
        build_so_with(dir, name, fn_name, &[])
    }

    /// [`build_so`], with `args` passed to the compiler too.
    fn build_so_with(dir: &Path, name: &str, fn_name: &str, args: &[&str]) -> Option<PathBuf> {
        let src = dir.join(format!("{name}.c"));
        std::fs::write(&src, format!("int {fn_name}(int x) {{ return x * 3 + 1; }}\n")).unwrap();
        let out = dir.join(format!("lib{name}.so"));
        let status = std::process::Command::new("cc")
            .args(["-shared", "-fPIC", "-g", "-O1"])
            .args(args)
            .arg("-o")
            .arg(&out)
            .arg(&src)
            .status();
        if !status.is_ok_and(|s| s.success()) {
            skip_without_compiler();
            return None;
        }
        Some(out)
    }

    /// Loads `path` and finds `sym` in it: the handle and the symbol's address.
    fn dlopen_sym(path: &Path, sym: &str) -> (*mut libc::c_void, u64) {
        let cpath = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
        let csym = std::ffi::CString::new(sym).unwrap();
        // SAFETY: NUL-terminated strings; the library built by `build_so` has no constructors.
        let (handle, f) = unsafe {
            let handle = libc::dlopen(cpath.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
            assert!(!handle.is_null(), "dlopen {path:?}");
            (handle, libc::dlsym(handle, csym.as_ptr()))
        };
        assert!(!f.is_null());
        (handle, f as u64)
    }

    #[test]
    fn dlopened_objects_are_named_and_unloads_forget_them() {
        let dir = scratch_dir("test");
        let (Some(a), Some(b)) = (build_so(&dir, "alpha", "alpha_fn"), build_so(&dir, "beta", "beta_fn")) else {
            return;
        };
        let mut s = Symbolizer::new();
        // Start with the object list as it is, before the dlopen.
        s.symbolize(known_function as *const () as usize as u64 + 1);
        let (ha, fa) = dlopen_sym(&a, "alpha_fn");
        let frames = s.symbolize_pc(fa).expect("alpha_fn not named");
        assert_eq!(innermost_name(&frames), "alpha_fn");
        assert!(frames[0].file.as_deref().unwrap().ends_with("alpha.c"), "{frames:?}");
        assert_eq!(frames[0].line, 1);
        // SAFETY: nothing of the library is used after this.
        unsafe { libc::dlclose(ha) };
        // Very likely at alpha's old address.
        let (hb, fb) = dlopen_sym(&b, "beta_fn");
        let frames = s.symbolize_pc(fb).expect("beta_fn not named");
        assert_eq!(innermost_name(&frames), "beta_fn", "{frames:?}");
        if fb == fa {
            eprintln!("beta loaded at alpha's address");
        }
        assert!(s.stats().unloaded >= 1, "{:?}", s.stats());
        // SAFETY: nothing of the library is used after this.
        unsafe { libc::dlclose(hb) };
        std::fs::remove_dir_all(&dir).ok();
    }

    /// A library unloaded after the symbolizer saw it loaded still names its code (frames
    /// sampled before the unload, named after it), and nothing of it is kept for the next
    /// library loaded at its addresses.
    #[test]
    fn an_unloaded_library_still_names_its_frames() {
        let dir = scratch_dir("unloaded");
        let (Some(a), Some(b)) = (build_so(&dir, "gone", "gone_fn"), build_so(&dir, "next", "next_fn")) else { return };
        let mut s = Symbolizer::new();
        let (ha, fa) = dlopen_sym(&a, "gone_fn");
        // A scan with the library loaded, as the writer's naming of other frames makes.
        s.symbolize(known_function as *const () as usize as u64 + 1);
        // SAFETY: nothing of the library is used after this.
        unsafe { libc::dlclose(ha) };
        let frames = s.symbolize_pc(fa).expect("gone_fn not named after the unload");
        assert_eq!(innermost_name(&frames), "gone_fn");
        assert!(s.stats().unloaded >= 1, "{:?}", s.stats());
        let (hb, fb) = dlopen_sym(&b, "next_fn");
        assert_eq!(innermost_name(&s.symbolize_pc(fb).expect("next_fn not named")), "next_fn");
        // SAFETY: nothing of the library is used after this.
        unsafe { libc::dlclose(hb) };
        std::fs::remove_dir_all(&dir).ok();
    }

    /// Objects without a build-id are told apart by their files: a library rebuilt at its path
    /// (the linker writes a new file) and loaded again, likely where it was, between two
    /// lookups, gets its own names rather than those of the one unloaded.
    #[test]
    fn a_library_rebuilt_without_a_build_id_gets_its_own_names() {
        let dir = scratch_dir("rebuilt");
        let no_build_id = ["-Wl,--build-id=none"];
        let Some(library) = build_so_with(&dir, "delta", "first_fn", &no_build_id) else { return };
        let mut s = Symbolizer::new();
        let (handle, first) = dlopen_sym(&library, "first_fn");
        assert_eq!(innermost_name(&s.symbolize_pc(first).expect("first_fn not named")), "first_fn");
        // SAFETY: nothing of the library is used after this.
        unsafe { libc::dlclose(handle) };
        build_so_with(&dir, "delta", "second_fn", &no_build_id).expect("rebuilt");
        let (handle, second) = dlopen_sym(&library, "second_fn");
        if second != first {
            eprintln!("the rebuilt library was loaded elsewhere");
        }
        assert_eq!(innermost_name(&s.symbolize_pc(second).expect("second_fn not named")), "second_fn");
        // SAFETY: nothing of the library is used after this.
        unsafe { libc::dlclose(handle) };
        std::fs::remove_dir_all(&dir).ok();
    }

    /// An object whose DWARF was moved to a separate file (as distributions ship their
    /// libraries: here with `objcopy --only-keep-debug` and a `.gnu_debuglink` to it) is named
    /// from its symbol table, unless the option asks for the debug file, which gives files and
    /// lines. The C library is named without its debug files by default too.
    #[test]
    fn separate_debug_files_are_opt_in() {
        let b = libc::getpid as *const () as usize as u64;
        let frames = Symbolizer::new().symbolize_pc(b).unwrap();
        assert!(frames.iter().all(|f| f.file.is_none()), "{frames:?}");

        let dir = scratch_dir("debuglink");
        let Some(library) = build_so(&dir, "gamma", "gamma_fn") else { return };
        let debug = dir.join("libgamma.debug");
        let objcopy = |args: &[&std::ffi::OsStr]| std::process::Command::new("objcopy").args(args).status();
        let split = [
            objcopy(&["--only-keep-debug".as_ref(), library.as_os_str(), debug.as_os_str()]),
            objcopy(&["--strip-debug".as_ref(), library.as_os_str()]),
            objcopy(&[format!("--add-gnu-debuglink={}", debug.display()).as_ref(), library.as_os_str()]),
        ];
        if !split.iter().all(|status| status.as_ref().is_ok_and(|s| s.success())) {
            crate::test_skip::skip(&format!("objcopy did not run (apt-get install binutils): {split:?}"));
            return;
        }
        let (handle, f) = dlopen_sym(&library, "gamma_fn");
        let plain = Symbolizer::new().symbolize_pc(f).expect("gamma_fn not named");
        assert_eq!(innermost_name(&plain), "gamma_fn");
        assert!(plain.iter().all(|f| f.file.is_none()), "read the debug file unasked: {plain:?}");
        let mut with = Symbolizer::with_options(Options { separate_debug_files: true, ..Options::default() });
        let frames = with.symbolize_pc(f).expect("gamma_fn not named");
        assert_eq!(innermost_name(&frames), "gamma_fn");
        assert!(frames[0].file.as_deref().is_some_and(|file| file.ends_with("gamma.c")), "{frames:?}");
        assert_eq!(frames[0].line, 1);
        // SAFETY: nothing of the library is used after this.
        unsafe { libc::dlclose(handle) };
        std::fs::remove_dir_all(&dir).ok();
    }
}
