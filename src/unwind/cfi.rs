//! DWARF unwinding with a cache of unwind rules (x86_64 Linux with glibc): the same stacks as
//! libgcc's unwinder, for a 30-frame stack in under 1 µs instead of about 4.4.
//!
//! To step from a frame to its caller, the walk needs three facts about the frame's code
//! address: how to compute the canonical frame address (the CFA: `rsp + n` or `rbp + n`), that
//! the return address is stored at CFA − 8, and where the caller's `rbp` was saved, if
//! anywhere. The first time the walk meets an address, it finds the address's FDE with
//! libgcc's `_Unwind_Find_FDE` (the lookup libgcc's unwinder makes for every frame: lock-free
//! with glibc ≥ 2.35), runs the CIE's and the FDE's call-frame instructions up to the address
//! and keeps the resulting [`Rule`] in a static table. Every later sample through that address
//! reads the table: no loader, no lock, no allocation. Each table slot is a sequence lock
//! (readers never wait: a slot being written reads as a miss).
//!
//! A frame whose rule is more than that (the CFA in another register or given by an
//! expression, the return address or `rbp` saved by an expression or in a register, a signal
//! frame) ends the walk with "unsupported", and the caller unwinds the whole stack with libgcc
//! instead; so does code without an FDE, which libgcc may still get through (a signal
//! trampoline without CFI). Normal stacks end where the return address is undefined (`_start`,
//! `clone3`). Every memory read is a word inside the live part of this thread's stack, so a
//! wrong rule can give wrong frames but never a fault; start-up calibration compares this
//! walk's stacks with libgcc's and does not use it when they differ.
//!
//! Cached rules go stale when the code at an address changes. Rules are only cached for code
//! in a loaded ELF object (not for JIT code, whose memory may be reused), and
//! [`invalidate_if_unloaded`] starts a new cache generation whenever the dynamic loader's
//! count of unloaded objects has changed: when tracing starts, and at each poll of the writer
//! thread. A library unloaded and another loaded at its address, then sampled before the
//! writer's next poll (milliseconds), could still be walked with the old rules.

use std::sync::atomic::{fence, AtomicU64, Ordering};

use super::Leading;
use crate::tracer::MAX_FRAMES;

/// Whether this target has the cached walker.
pub(crate) const SUPPORTED: bool = cfg!(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu"));

/// DWARF register numbers (x86_64 psABI).
const RBP: u64 = 6;
const RSP: u64 = 7;

/// What the walk does at one code address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Rule {
    /// A frame: CFA = (`rbp` if `cfa_in_rbp` else `rsp`) + `cfa_offset`; the return address
    /// at CFA − 8; the caller's `rbp` at CFA + `rbp_offset` when saved, else unchanged.
    Step { cfa_in_rbp: bool, cfa_offset: i32, rbp_offset: Option<i16> },
    /// The outermost frame (its return address is undefined).
    End,
    /// A rule the walk cannot follow, or code without an FDE: libgcc unwinds this stack.
    Unsupported,
}

impl Rule {
    const END: u64 = 1 << 62;
    const UNSUPPORTED: u64 = 2 << 62;
    const CFA_IN_RBP: u64 = 1 << 48;
    const RBP_SAVED: u64 = 1 << 49;

    /// The rule as one nonzero word (a cache slot's value).
    fn pack(self) -> u64 {
        match self {
            Rule::End => Rule::END,
            Rule::Unsupported => Rule::UNSUPPORTED,
            Rule::Step { cfa_in_rbp, cfa_offset, rbp_offset } => {
                let mut word = cfa_offset as u32 as u64 | (rbp_offset.unwrap_or(0) as u16 as u64) << 32;
                if cfa_in_rbp {
                    word |= Rule::CFA_IN_RBP;
                }
                if rbp_offset.is_some() {
                    word |= Rule::RBP_SAVED;
                }
                // A step is never the zero word: its flags or its CFA offset (≥ 8) are set.
                word
            }
        }
    }

    fn unpack(word: u64) -> Rule {
        match word & (3 << 62) {
            Rule::END => Rule::End,
            Rule::UNSUPPORTED => Rule::Unsupported,
            _ => Rule::Step {
                cfa_in_rbp: word & Rule::CFA_IN_RBP != 0,
                cfa_offset: word as u32 as i32,
                rbp_offset: (word & Rule::RBP_SAVED != 0).then_some((word >> 32) as u16 as i16),
            },
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The walk

/// Up to `cap` return addresses, innermost first, after the `skip` ones; `stack` is this
/// thread's `(lowest address, end)`. `None` when the walk cannot go on (a rule it cannot
/// follow, a step that leaves the stack, or the sample taken on another stack): the caller
/// then unwinds with libgcc.
#[inline(never)]
pub(super) fn capture(
    skip: Leading,
    cap: usize,
    frames: &mut [u64; MAX_FRAMES],
    stack: (usize, usize),
) -> Option<usize> {
    const WORD: u64 = 8;
    let cap = cap.min(MAX_FRAMES);
    let (pc, sp, fp) = registers();
    let (lo, hi) = (stack.0 as u64, stack.1 as u64);
    if sp < lo || sp >= hi {
        return None;
    }
    // Reads of a word at `at`, only inside the live part of this thread's stack.
    let read = |at: u64| -> Option<u64> {
        // SAFETY: `[at, at + 8)` lies within `[sp, hi)`, the mapped, live part of this thread's
        // stack (the frames of this function's callers); an aligned, volatile read of a word.
        (at >= sp && at.is_multiple_of(WORD) && at <= hi - WORD)
            .then(|| unsafe { std::ptr::read_volatile(at as *const u64) })
    };
    // The frame being stepped from: its registers, and the address to look its rule up by
    // (a return address minus one, inside the call instruction, for every frame but the first).
    let (mut rsp, mut rbp, mut lookup) = (sp, fp, pc);
    let (mut n, mut seen) = (0, 0);
    while n < cap {
        let (cfa_in_rbp, cfa_offset, rbp_offset) = match rule_for(lookup) {
            Rule::Step { cfa_in_rbp, cfa_offset, rbp_offset } => (cfa_in_rbp, cfa_offset, rbp_offset),
            Rule::End => break,
            Rule::Unsupported => return None,
        };
        let cfa = (if cfa_in_rbp { rbp } else { rsp }).checked_add_signed(cfa_offset as i64)?;
        // The caller's frame is above this one: the walk always ends.
        if cfa <= rsp {
            return None;
        }
        let ret = read(cfa - WORD)?;
        if let Some(offset) = rbp_offset {
            rbp = read(cfa.checked_add_signed(offset as i64)?)?;
        }
        rsp = cfa;
        if ret == 0 {
            break;
        }
        if !skip.drops(seen, ret) {
            frames[n] = ret;
            n += 1;
        }
        seen += 1;
        lookup = ret - 1;
    }
    Some(n)
}

/// The current `(instruction address, stack pointer, frame pointer)`.
#[inline(always)]
fn registers() -> (u64, u64, u64) {
    let (pc, sp, fp): (u64, u64, u64);
    // SAFETY: reads the instruction pointer and two registers; no memory access.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        std::arch::asm!("lea {pc}, [rip]", "mov {sp}, rsp", "mov {fp}, rbp", pc = out(reg) pc, sp = out(reg) sp,
            fp = out(reg) fp, options(nomem, nostack, preserves_flags));
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        (pc, sp, fp) = (0, 0, 0);
    }
    (pc, sp, fp)
}

// ---------------------------------------------------------------------------------------------
// The rule cache

/// log2 of the number of cache sets.
const SET_BITS: u32 = 14;
/// Slots per set.
const WAYS: usize = 2;

/// One cached rule, under a sequence lock: `seq` is odd while the slot is being written.
/// `key` is the code address tagged with the cache generation (see [`key`]).
#[repr(C, align(32))]
struct Slot {
    seq: AtomicU64,
    key: AtomicU64,
    rule: AtomicU64,
}

/// The slots an address may be cached in: one cache line.
#[repr(C, align(64))]
struct Set([Slot; WAYS]);

#[allow(clippy::declare_interior_mutable_const)] // Only used to initialise `CACHE`.
const EMPTY_SLOT: Slot = Slot { seq: AtomicU64::new(0), key: AtomicU64::new(0), rule: AtomicU64::new(0) };
#[allow(clippy::declare_interior_mutable_const)] // Only used to initialise `CACHE`.
const EMPTY_SET: Set = Set([EMPTY_SLOT; WAYS]);
/// 16 Ki sets of 2 slots (1 MiB), in `.bss`: only the pages of sets in use become resident.
/// A big program's sampled stacks hold thousands of return addresses; two ways keep a pair of
/// them that share a set from evicting each other on every sample.
static CACHE: [Set; 1 << SET_BITS] = [EMPTY_SET; 1 << SET_BITS];
/// Picks the slot a miss overwrites when both of its set's are in use.
static VICTIM: AtomicU64 = AtomicU64::new(0);
/// The cache generation: rules cached in an earlier one are misses.
static GENERATION: AtomicU64 = AtomicU64::new(1);
/// The number of libraries unloaded, as last seen by [`invalidate_if_unloaded`].
static UNLOADS: AtomicU64 = AtomicU64::new(0);

/// A code address tagged with the generation in the bits above 2^48 (user-space addresses
/// below 2^47 only: others are never cached).
fn key(pc: u64) -> u64 {
    pc | GENERATION.load(Ordering::Relaxed) << 48
}

fn set(pc: u64) -> &'static Set {
    &CACHE[(pc.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - SET_BITS)) as usize]
}

impl Slot {
    /// The slot's rule if it holds `key`'s (a slot being written holds nothing).
    #[inline(always)]
    fn get(&self, key: u64) -> Option<Rule> {
        let seq = self.seq.load(Ordering::Acquire);
        let (cached_key, rule) = (self.key.load(Ordering::Relaxed), self.rule.load(Ordering::Relaxed));
        fence(Ordering::Acquire);
        (seq.is_multiple_of(2) && cached_key == key && self.seq.load(Ordering::Relaxed) == seq)
            .then(|| Rule::unpack(rule))
    }

    /// Store `key`'s rule unless another thread is writing the slot (then it is not cached).
    fn put(&self, key: u64, rule: Rule) {
        let seq = self.seq.load(Ordering::Relaxed);
        if seq.is_multiple_of(2)
            && self.seq.compare_exchange(seq, seq + 1, Ordering::Acquire, Ordering::Relaxed).is_ok()
        {
            fence(Ordering::Release);
            self.key.store(key, Ordering::Relaxed);
            self.rule.store(rule.pack(), Ordering::Relaxed);
            self.seq.store(seq + 2, Ordering::Release);
        }
    }

    /// Whether the slot holds a rule of the current generation (`key`'s).
    fn in_use(&self, key: u64) -> bool {
        self.key.load(Ordering::Relaxed) >> 48 == key >> 48
    }
}

/// The rule for code address `pc`: cached, or computed from the unwind tables and cached.
fn rule_for(pc: u64) -> Rule {
    if pc >> 47 != 0 {
        return rule_from_tables(pc).0;
    }
    let key = key(pc);
    let set = set(pc);
    match set.0.iter().find_map(|slot| slot.get(key)) {
        Some(rule) => rule,
        None => cache_miss(pc, key, set),
    }
}

#[cold]
#[inline(never)]
fn cache_miss(pc: u64, key: u64, set: &Set) -> Rule {
    let (rule, cacheable) = rule_from_tables(pc);
    // (Another thread may have cached it meanwhile: one slot is enough.)
    if cacheable && !set.0.iter().any(|slot| slot.get(key).is_some()) {
        // A slot with nothing of this generation in it, else either, in turn.
        let victim = match set.0.iter().position(|slot| !slot.in_use(key)) {
            Some(free) => free,
            None => VICTIM.fetch_add(1, Ordering::Relaxed) as usize % WAYS,
        };
        set.0[victim].put(key, rule);
    }
    rule
}

/// Start a new cache generation if a library was unloaded since the last call: its address
/// range may now hold other code. Called by the writer thread (it may take the dynamic
/// loader's lock).
pub(crate) fn invalidate_if_unloaded() {
    if !SUPPORTED {
        return;
    }
    let unloads = unloads();
    if UNLOADS.swap(unloads, Ordering::Relaxed) != unloads {
        // Wraps after 2^16 generations: an entry that old has long been overwritten.
        let next = (GENERATION.load(Ordering::Relaxed) + 1) & 0xFFFF;
        GENERATION.store(next.max(1), Ordering::Relaxed);
    }
}

/// The number of objects the dynamic loader has unloaded so far.
fn unloads() -> u64 {
    unsafe extern "C" fn first(info: *mut libc::dl_phdr_info, _size: libc::size_t, out: *mut libc::c_void) -> i32 {
        // SAFETY: the loader passes a valid `dl_phdr_info`, and `out` is the `u64` below.
        unsafe { *out.cast::<u64>() = (*info).dlpi_subs };
        1
    }
    let mut subs: u64 = 0;
    // SAFETY: the callback only reads the info it is given and writes the local `subs`.
    unsafe { libc::dl_iterate_phdr(Some(first), (&mut subs as *mut u64).cast()) };
    subs
}

// ---------------------------------------------------------------------------------------------
// Reading the unwind tables

/// What `_Unwind_Find_FDE` reports besides the FDE (libgcc's `struct dwarf_eh_bases`).
#[repr(C)]
struct EhBases {
    text: *const u8,
    data: *const u8,
    /// The start of the function the FDE covers.
    func: *const u8,
}

#[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]
extern "C" {
    /// libgcc's lookup of the FDE covering `pc` (null when none does).
    fn _Unwind_Find_FDE(pc: *const u8, bases: *mut EhBases) -> *const u8;
}

/// The rule for `pc` from the unwind tables, and whether it may be cached: whether `pc` is in
/// a loaded ELF object (as far as can be told without the loader's lock).
fn rule_from_tables(pc: u64) -> (Rule, bool) {
    #[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]
    {
        let mut bases = EhBases { text: std::ptr::null(), data: std::ptr::null(), func: std::ptr::null() };
        // SAFETY: `_Unwind_Find_FDE` only reads the loader's tables and writes `bases`.
        let fde = unsafe { _Unwind_Find_FDE(pc as *const u8, &mut bases) };
        if fde.is_null() {
            return (Rule::Unsupported, false);
        }
        // SAFETY: a non-null result points to an FDE in a mapped `.eh_frame` section (of a
        // loaded object, or registered with `__register_frame`), whose CIE precedes it in the
        // same section. It stays mapped while that code stays loaded; as for libgcc's own
        // unwinder, a `dlclose` of it by another thread during this call (possible only if
        // `pc` is not a live frame of this thread, i.e. a wrong rule read a stray word) is
        // the caller's race.
        let rule = unsafe { rule_from_fde(fde, bases.func as u64, pc) }.unwrap_or(Rule::Unsupported);
        (rule, in_loaded_object(pc))
    }
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu")))]
    {
        let _ = pc;
        (Rule::Unsupported, false)
    }
}

/// Whether `pc` is in an object the dynamic loader loaded, by glibc's lock-free
/// `_dl_find_object` (2.35 and later); assumed on older C libraries, which lack it. The
/// function is looked up (`dlsym`, which takes the loader's lock) on the first cache miss,
/// which is start-up calibration's, before any sample is taken.
#[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]
fn in_loaded_object(pc: u64) -> bool {
    use std::sync::atomic::AtomicUsize;
    /// `_dl_find_object`, looked up on first use: 0 before, 1 when absent.
    static FIND_OBJECT: AtomicUsize = AtomicUsize::new(0);
    /// Room for glibc's `struct dl_find_object` (flags, map start and end, link map, EH frame
    /// and 7 reserved words on x86_64: 12 words).
    #[repr(C)]
    struct DlFindObject([usize; 16]);
    type FindObject = unsafe extern "C" fn(*mut libc::c_void, *mut DlFindObject) -> libc::c_int;
    let mut find = FIND_OBJECT.load(Ordering::Relaxed);
    if find == 0 {
        // SAFETY: `dlsym` with `RTLD_DEFAULT` and a NUL-terminated name only looks the symbol up.
        let symbol = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"_dl_find_object".as_ptr()) };
        find = if symbol.is_null() { 1 } else { symbol as usize };
        FIND_OBJECT.store(find, Ordering::Relaxed);
    }
    if find == 1 {
        return true;
    }
    let mut result = DlFindObject([0; 16]);
    // SAFETY: `find` is glibc's `_dl_find_object`, with that signature; it writes at most a
    // `struct dl_find_object` (smaller than `DlFindObject`) and reads nothing else.
    let find: FindObject = unsafe { std::mem::transmute::<usize, FindObject>(find) };
    // SAFETY: as above; `pc` is only compared with the loaded objects' ranges.
    unsafe { find(pc as *mut libc::c_void, &mut result) == 0 }
}

/// The rule at `pc` of the FDE at `fde`, which covers code starting at `start`; `None` for
/// malformed or unsupported CFI.
///
/// # Safety
/// `fde` points to an FDE in a mapped `.eh_frame` section, as `_Unwind_Find_FDE` returns.
unsafe fn rule_from_fde(fde: *const u8, start: u64, pc: u64) -> Option<Rule> {
    /// The body of the CIE or FDE at `at`: the bytes after its length word.
    ///
    /// # Safety
    /// `at` points to a CIE or FDE of a mapped `.eh_frame` section, which stays mapped for `'a`.
    unsafe fn entry<'a>(at: *const u8) -> Option<&'a [u8]> {
        // SAFETY: an entry starts with its length word, and that many bytes follow it.
        let length = unsafe { at.cast::<u32>().read_unaligned() };
        // 0xffffffff would announce 64-bit DWARF, which .eh_frame does not use.
        // SAFETY: as above.
        (length != u32::MAX).then(|| unsafe { std::slice::from_raw_parts(at.add(4), length as usize) })
    }
    // SAFETY: the caller's contract.
    let fde_body = unsafe { entry(fde) }?;
    // The CIE pointer counts back from its own position, the first word of the FDE's body.
    let cie_pointer = u32::from_le_bytes(fde_body.get(..4)?.try_into().ok()?);
    // SAFETY: the CIE lies at that distance before the FDE, in the same section.
    let cie_body = unsafe { entry(fde.add(4).wrapping_sub(cie_pointer as usize)) }?;
    let cie = Cie::parse(cie_body)?;
    let mut cursor = Cursor(&fde_body[4..]);
    // The FDE's address and length (the lookup already matched them) and augmentation data.
    cursor.skip_pointer(cie.pointer_encoding)?;
    cursor.skip_pointer(cie.pointer_encoding)?;
    if cie.has_augmentation_data {
        let length = cursor.uleb()?;
        cursor.skip(length)?;
    }
    let mut machine = Machine::new(&cie);
    machine.run(Cursor(cie.initial_instructions), &cie, u64::MAX, start)?;
    machine.initial = machine.row;
    machine.run(cursor, &cie, pc, start)?;
    if cie.signal_frame {
        return None;
    }
    machine.row.rule()
}

/// The parts of a CIE the walk needs.
struct Cie<'a> {
    code_alignment: u64,
    data_alignment: i64,
    return_address_register: u64,
    /// How the FDE encodes its address and length (`DW_EH_PE_*`).
    pointer_encoding: u8,
    has_augmentation_data: bool,
    signal_frame: bool,
    initial_instructions: &'a [u8],
}

impl<'a> Cie<'a> {
    fn parse(body: &'a [u8]) -> Option<Cie<'a>> {
        let mut cursor = Cursor(body);
        if cursor.u32()? != 0 {
            return None; // Not a CIE.
        }
        let version = cursor.u8()?;
        let augmentation = cursor.c_string()?;
        if augmentation.starts_with(b"eh") {
            return None; // GCC 2's format.
        }
        let code_alignment = cursor.uleb()?;
        let data_alignment = cursor.sleb()?;
        let return_address_register = if version == 1 { cursor.u8()? as u64 } else { cursor.uleb()? };
        let mut cie = Cie {
            code_alignment,
            data_alignment,
            return_address_register,
            pointer_encoding: 0,
            has_augmentation_data: augmentation.first() == Some(&b'z'),
            signal_frame: false,
            initial_instructions: &[],
        };
        if cie.has_augmentation_data {
            let length = cursor.uleb()?;
            let mut data = Cursor(cursor.take(length)?);
            for &letter in &augmentation[1..] {
                match letter {
                    b'R' => cie.pointer_encoding = data.u8()?,
                    b'L' => _ = data.u8()?,
                    b'P' => {
                        let encoding = data.u8()?;
                        data.skip_pointer(encoding)?;
                    }
                    b'S' => cie.signal_frame = true,
                    // Other letters come with no data, or after all the data the walk needs.
                    _ => break,
                }
            }
        } else if !augmentation.is_empty() {
            return None;
        }
        cie.initial_instructions = cursor.0;
        Some(cie)
    }
}

/// How a register is recovered in a row of the CFI table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Recovery {
    /// Unchanged in the caller (no rule, or `DW_CFA_same_value`).
    Same,
    Undefined,
    /// Saved at CFA + offset.
    Offset(i64),
    /// Any other rule.
    Other,
}

/// A row of the CFI table, reduced to what the walk needs.
#[derive(Debug, Clone, Copy)]
struct Row {
    cfa_register: u64,
    cfa_offset: i64,
    /// The CFA is given by an expression (`cfa_register` and `cfa_offset` then do not apply).
    cfa_is_expression: bool,
    rbp: Recovery,
    return_address: Recovery,
}

impl Row {
    fn rule(&self) -> Option<Rule> {
        match self.return_address {
            Recovery::Undefined => return Some(Rule::End),
            Recovery::Offset(-8) => {}
            _ => return None,
        }
        let cfa_in_rbp = match self.cfa_register {
            RSP => false,
            RBP => true,
            _ => return None,
        };
        let rbp_offset = match self.rbp {
            Recovery::Same => None,
            Recovery::Offset(offset) => Some(i16::try_from(offset).ok()?),
            Recovery::Undefined | Recovery::Other => return None,
        };
        if self.cfa_is_expression {
            return None;
        }
        let cfa_offset = i32::try_from(self.cfa_offset).ok().filter(|&o| o >= 8)?;
        Some(Rule::Step { cfa_in_rbp, cfa_offset, rbp_offset })
    }
}

/// The CFI state machine, tracking the CFA, `rbp` and the return address.
struct Machine {
    row: Row,
    /// The row after the CIE's initial instructions (for `DW_CFA_restore`).
    initial: Row,
    /// `DW_CFA_remember_state`'s stack.
    remembered: [Row; 8],
    depth: usize,
    return_address_register: u64,
}

impl Machine {
    fn new(cie: &Cie<'_>) -> Machine {
        let row = Row {
            cfa_register: RSP,
            cfa_offset: 0,
            cfa_is_expression: false,
            rbp: Recovery::Same,
            return_address: Recovery::Same,
        };
        Machine {
            row,
            initial: row,
            remembered: [row; 8],
            depth: 0,
            return_address_register: cie.return_address_register,
        }
    }

    /// Set how register `register` is recovered (only `rbp` and the return address matter).
    fn set(&mut self, register: u64, recovery: Recovery) {
        if register == RBP {
            self.row.rbp = recovery;
        } else if register == self.return_address_register {
            self.row.return_address = recovery;
        }
    }

    fn restore(&mut self, register: u64) {
        let initial = self.initial;
        if register == RBP {
            self.row.rbp = initial.rbp;
        } else if register == self.return_address_register {
            self.row.return_address = initial.return_address;
        }
    }

    /// Run `code` until the row that covers `pc` (the instructions of a function starting at
    /// `start`). `None` for malformed or unknown instructions.
    fn run(&mut self, mut code: Cursor<'_>, cie: &Cie<'_>, pc: u64, start: u64) -> Option<()> {
        let mut location = start;
        while !code.0.is_empty() {
            let op = code.u8()?;
            let advance = match op >> 6 {
                // DW_CFA_advance_loc
                1 => Some((op & 0x3f) as u64),
                // DW_CFA_offset
                2 => {
                    let offset = factored(code.uleb()?, cie.data_alignment)?;
                    self.set((op & 0x3f) as u64, Recovery::Offset(offset));
                    None
                }
                // DW_CFA_restore
                3 => {
                    self.restore((op & 0x3f) as u64);
                    None
                }
                _ => self.extended(op, &mut code, cie)?,
            };
            if let Some(delta) = advance {
                location = location.checked_add(delta.checked_mul(cie.code_alignment)?)?;
                if location > pc {
                    break;
                }
            }
        }
        Some(())
    }

    /// One of the instructions with a full opcode byte; returns its advance, if it is one.
    fn extended(&mut self, op: u8, code: &mut Cursor<'_>, cie: &Cie<'_>) -> Option<Option<u64>> {
        let data_alignment = cie.data_alignment;
        match op {
            0x00 => {}                                     // DW_CFA_nop
            0x02 => return Some(Some(code.u8()? as u64)),  // DW_CFA_advance_loc1
            0x03 => return Some(Some(code.u16()? as u64)), // DW_CFA_advance_loc2
            0x04 => return Some(Some(code.u32()? as u64)), // DW_CFA_advance_loc4
            0x05 => {
                // DW_CFA_offset_extended
                let register = code.uleb()?;
                let offset = factored(code.uleb()?, data_alignment)?;
                self.set(register, Recovery::Offset(offset));
            }
            0x06 => {
                // DW_CFA_restore_extended
                let register = code.uleb()?;
                self.restore(register);
            }
            0x07 => {
                // DW_CFA_undefined
                let register = code.uleb()?;
                self.set(register, Recovery::Undefined);
            }
            0x08 => {
                // DW_CFA_same_value
                let register = code.uleb()?;
                self.set(register, Recovery::Same);
            }
            0x09 => {
                // DW_CFA_register
                let register = code.uleb()?;
                code.uleb()?;
                self.set(register, Recovery::Other);
            }
            0x0a => {
                // DW_CFA_remember_state
                *self.remembered.get_mut(self.depth)? = self.row;
                self.depth += 1;
            }
            0x0b => {
                // DW_CFA_restore_state: the CFA rule too, as libgcc and LLVM's libunwind do
                // (compilers wrap a mid-function epilogue, which moves the CFA, in a pair).
                self.depth = self.depth.checked_sub(1)?;
                self.row = self.remembered[self.depth];
            }
            0x0c => {
                // DW_CFA_def_cfa
                self.row.cfa_register = code.uleb()?;
                self.row.cfa_offset = i64::try_from(code.uleb()?).ok()?;
                self.row.cfa_is_expression = false;
            }
            0x0d => {
                // DW_CFA_def_cfa_register
                self.row.cfa_register = code.uleb()?;
                self.row.cfa_is_expression = false;
            }
            // DW_CFA_def_cfa_offset (an expression CFA stays one, as in libgcc)
            0x0e => self.row.cfa_offset = i64::try_from(code.uleb()?).ok()?,
            0x0f => {
                // DW_CFA_def_cfa_expression
                let length = code.uleb()?;
                code.skip(length)?;
                self.row.cfa_is_expression = true;
            }
            0x10 | 0x16 => {
                // DW_CFA_expression, DW_CFA_val_expression
                let register = code.uleb()?;
                let length = code.uleb()?;
                code.skip(length)?;
                self.set(register, Recovery::Other);
            }
            0x11 => {
                // DW_CFA_offset_extended_sf
                let register = code.uleb()?;
                let offset = code.sleb()?.checked_mul(data_alignment)?;
                self.set(register, Recovery::Offset(offset));
            }
            0x12 => {
                // DW_CFA_def_cfa_sf
                self.row.cfa_register = code.uleb()?;
                self.row.cfa_offset = code.sleb()?.checked_mul(data_alignment)?;
                self.row.cfa_is_expression = false;
            }
            0x13 => self.row.cfa_offset = code.sleb()?.checked_mul(data_alignment)?, // DW_CFA_def_cfa_offset_sf
            0x14 | 0x15 => {
                // DW_CFA_val_offset, DW_CFA_val_offset_sf
                let register = code.uleb()?;
                if op == 0x14 {
                    code.uleb()?;
                } else {
                    code.sleb()?;
                }
                self.set(register, Recovery::Other);
            }
            0x2e => _ = code.uleb()?, // DW_CFA_GNU_args_size
            0x2f => {
                // DW_CFA_GNU_negative_offset_extended
                let register = code.uleb()?;
                let offset = factored(code.uleb()?, data_alignment)?.checked_neg()?;
                self.set(register, Recovery::Offset(offset));
            }
            // DW_CFA_set_loc and anything unknown.
            _ => return None,
        }
        Some(None)
    }
}

/// An unsigned operand times the data alignment factor; `None` on overflow.
fn factored(operand: u64, data_alignment: i64) -> Option<i64> {
    i64::try_from(operand).ok()?.checked_mul(data_alignment)
}

/// A reader of CFI bytes; every read is checked.
struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: u64) -> Option<&'a [u8]> {
        let n = usize::try_from(n).ok()?;
        let (head, rest) = self.0.split_at_checked(n)?;
        self.0 = rest;
        Some(head)
    }

    fn skip(&mut self, n: u64) -> Option<()> {
        self.take(n).map(drop)
    }

    fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }

    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes(self.take(2)?.try_into().ok()?))
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }

    fn uleb(&mut self) -> Option<u64> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = self.u8()?;
            value |= ((byte & 0x7f) as u64) << shift;
            if byte & 0x80 == 0 {
                return Some(value);
            }
        }
        None
    }

    fn sleb(&mut self) -> Option<i64> {
        let mut value = 0i64;
        for shift in (0..64).step_by(7) {
            let byte = self.u8()?;
            value |= ((byte & 0x7f) as i64) << shift;
            if byte & 0x80 == 0 {
                if shift + 7 < 64 && byte & 0x40 != 0 {
                    value |= -1 << (shift + 7);
                }
                return Some(value);
            }
        }
        None
    }

    fn c_string(&mut self) -> Option<&'a [u8]> {
        let end = self.0.iter().position(|&b| b == 0)?;
        let s = self.take(end as u64)?;
        self.skip(1)?;
        Some(s)
    }

    /// Skip a pointer encoded with `DW_EH_PE_*` `encoding` (its format: the low four bits).
    fn skip_pointer(&mut self, encoding: u8) -> Option<()> {
        if encoding == 0xff {
            return Some(()); // DW_EH_PE_omit
        }
        match encoding & 0x0f {
            0x00 | 0x04 | 0x0c => self.skip(8),
            0x01 => self.uleb().map(drop),
            0x09 => self.sleb().map(drop),
            0x02 | 0x0a => self.skip(2),
            0x03 | 0x0b => self.skip(4),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_pack_into_one_nonzero_word() {
        let rules = [
            Rule::End,
            Rule::Unsupported,
            Rule::Step { cfa_in_rbp: false, cfa_offset: 8, rbp_offset: None },
            Rule::Step { cfa_in_rbp: true, cfa_offset: 16, rbp_offset: Some(-16) },
            Rule::Step { cfa_in_rbp: false, cfa_offset: 1 << 20, rbp_offset: Some(-4096) },
        ];
        for rule in rules {
            assert_ne!(rule.pack(), 0);
            assert_eq!(Rule::unpack(rule.pack()), rule);
        }
    }

    #[test]
    fn leb128() {
        let mut c = Cursor(&[0xe5, 0x8e, 0x26, 0x7f, 0x80, 0x7f, 0x02]);
        assert_eq!(c.uleb(), Some(624_485));
        assert_eq!(c.sleb(), Some(-1));
        assert_eq!(c.sleb(), Some(-128));
        assert_eq!(c.sleb(), Some(2));
        assert_eq!(c.uleb(), None, "truncated");
    }

    /// A CIE as GCC and LLVM write it for x86_64 (`zR`, pcrel|sdata4, code alignment 1, data
    /// alignment −8, return address in r16 at CFA − 8, CFA = rsp + 8), then an FDE body.
    fn cie() -> Vec<u8> {
        vec![0, 0, 0, 0, 1, b'z', b'R', 0, 1, 0x78, 16, 1, 0x1b, 0x0c, 7, 8, 0x90, 1]
    }

    fn rule_at(fde_instructions: &[u8], offset: u64) -> Option<Rule> {
        let cie = cie();
        let cie = Cie::parse(&cie)?;
        let mut machine = Machine::new(&cie);
        machine.run(Cursor(cie.initial_instructions), &cie, u64::MAX, 0x1000)?;
        machine.initial = machine.row;
        machine.run(Cursor(fde_instructions), &cie, 0x1000 + offset, 0x1000)?;
        machine.row.rule()
    }

    #[test]
    fn rows_of_a_function_with_a_frame_pointer() {
        // push rbp; mov rbp, rsp; ...; pop rbp; ret
        let code = [
            0x41, 0x0e, 16, 0x86, 2, // at +1: CFA = rsp + 16; rbp at CFA − 16
            0x43, 0x0d, 6, // at +4: CFA = rbp + 16
            0x4a, 0x0c, 7, 8, // at +14: CFA = rsp + 8
        ];
        let step = |in_rbp, off, rbp| Some(Rule::Step { cfa_in_rbp: in_rbp, cfa_offset: off, rbp_offset: rbp });
        assert_eq!(rule_at(&code, 0), step(false, 8, None));
        assert_eq!(rule_at(&code, 1), step(false, 16, Some(-16)));
        assert_eq!(rule_at(&code, 3), step(false, 16, Some(-16)));
        assert_eq!(rule_at(&code, 4), step(true, 16, Some(-16)));
        assert_eq!(rule_at(&code, 13), step(true, 16, Some(-16)));
        assert_eq!(rule_at(&code, 14), step(false, 8, Some(-16)));
    }

    #[test]
    fn remembered_state_restored_and_unsupported_rules() {
        // remember; CFA = rsp + 32; at +2 restore.
        let code = [0x0a, 0x0e, 32, 0x42, 0x0b];
        assert_eq!(rule_at(&code, 1), Some(Rule::Step { cfa_in_rbp: false, cfa_offset: 32, rbp_offset: None }));
        assert_eq!(rule_at(&code, 2), Some(Rule::Step { cfa_in_rbp: false, cfa_offset: 8, rbp_offset: None }));
        // A restore without a remember is malformed.
        assert_eq!(rule_at(&[0x0b], 0), None);
        // The CFA in r10 (stack realignment) or given by an expression: unsupported.
        assert_eq!(rule_at(&[0x0c, 10, 0], 0), None);
        assert_eq!(rule_at(&[0x0f, 2, 0x77, 8], 0), None);
        // ... and stays an expression when only its offset changes, as in libgcc.
        assert_eq!(rule_at(&[0x0f, 2, 0x77, 8, 0x0e, 16], 0), None);
        // Offsets that overflow when factored.
        let huge = [0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01]; // 2^63
        assert_eq!(rule_at(&[[0x05, 6].as_slice(), &huge].concat(), 0), None);
        assert_eq!(
            rule_at(&[[0x86].as_slice(), &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f]].concat(), 0),
            None
        );
        // rbp saved by an expression: unsupported; another register's: irrelevant.
        assert_eq!(rule_at(&[0x10, 6, 1, 0x96], 0), None);
        assert!(matches!(rule_at(&[0x10, 3, 1, 0x96], 0), Some(Rule::Step { .. })));
        // The return address undefined: the end of the stack.
        assert_eq!(rule_at(&[0x07, 16], 0), Some(Rule::End));
        // Truncated or unknown instructions.
        assert_eq!(rule_at(&[0x0c, 7], 0), None);
        assert_eq!(rule_at(&[0x3f], 0), None);
    }

    /// Stacks `depth` frames deeper than the caller's, captured by both walkers.
    #[inline(never)]
    fn both_at(depth: usize, out: &mut (Vec<u64>, Vec<u64>)) {
        if depth > 0 {
            both_at(std::hint::black_box(depth - 1), out);
            std::hint::black_box(());
            return;
        }
        let bounds = super::super::frame_pointers::stack_bounds().expect("stack bounds");
        let mut frames = [0; MAX_FRAMES];
        let n = capture(Leading::NONE, MAX_FRAMES, &mut frames, bounds).expect("a stack the walk can follow");
        out.0 = frames[..n].to_vec();
        let n = super::super::capture_libgcc(Leading::NONE, MAX_FRAMES, &mut frames);
        out.1 = frames[..n].to_vec();
    }

    #[test]
    fn stacks_match_libgcc() {
        if !SUPPORTED {
            return;
        }
        for depth in [0, 1, 7, 40] {
            let mut stacks = Default::default();
            // Twice: computed, then from the cache.
            for _ in 0..2 {
                both_at(depth, &mut stacks);
                let (ours, libgcc) = &stacks;
                // Both stacks start with the frame of `both_at` (at different calls); the rest
                // are the same return addresses.
                assert!(ours.len() > depth + 2, "{ours:x?}");
                assert_eq!(ours[1..], libgcc[libgcc.len() + 1 - ours.len()..], "depth {depth}");
            }
        }
    }

    /// Held by the tests that look into the cache or change its generation.
    static GENERATION_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

    #[test]
    fn two_addresses_of_one_set_are_both_cached() {
        if !SUPPORTED {
            return;
        }
        let _lock = GENERATION_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let first = rule_for as *const () as u64 + 1;
        let index = |pc: u64| set(pc) as *const Set;
        // Another address of this program's code in the same set (one in 16 Ki is).
        let second = (first + 1..first + (64 << 20))
            .find(|&pc| index(pc) == index(first) && rule_from_tables(pc).1)
            .expect("an address sharing the set");
        // Empty the set (generation 0 is never current), which other tests' walks may use.
        for slot in &set(first).0 {
            slot.put(0, Rule::End);
        }
        let cached = |pc: u64| set(pc).0.iter().any(|slot| slot.get(key(pc)).is_some());
        assert_eq!(rule_for(first), rule_from_tables(first).0);
        assert_eq!(rule_for(second), rule_from_tables(second).0);
        assert!(cached(first) && cached(second));
    }

    #[test]
    fn unloading_a_library_starts_a_new_cache_generation() {
        if !SUPPORTED {
            return;
        }
        let _lock = GENERATION_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        invalidate_if_unloaded();
        let before = GENERATION.load(Ordering::Relaxed);
        invalidate_if_unloaded();
        assert_eq!(GENERATION.load(Ordering::Relaxed), before, "nothing unloaded");
        // A glibc library that nothing else loads, so that closing it unloads it.
        // SAFETY: loading and unloading a C library with no constructors of note.
        let handle = unsafe { libc::dlopen(c"libBrokenLocale.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            println!("libBrokenLocale.so.1 not found: not checked");
            return;
        }
        // SAFETY: the handle just returned by dlopen, closed once.
        unsafe { libc::dlclose(handle) };
        invalidate_if_unloaded();
        // (A writer thread of another test may have noticed the unload first.)
        assert_ne!(GENERATION.load(Ordering::Relaxed), before);
    }

    #[test]
    fn rules_are_cached_only_for_code_of_loaded_objects() {
        if !SUPPORTED {
            return;
        }
        let code = rules_are_cached_only_for_code_of_loaded_objects as *const () as u64;
        assert!(in_loaded_object(code));
        assert!(rule_from_tables(code + 1).1);
        let heap = Box::new(0u64);
        let heap = &*heap as *const u64 as u64;
        if !super::super::has_lock_free_table_lookup() {
            println!("no _dl_find_object: every rule is cached");
            return;
        }
        assert!(!in_loaded_object(heap));
        assert_eq!(rule_from_tables(heap), (Rule::Unsupported, false), "no FDE: libgcc's to unwind");
    }

    #[test]
    fn the_walk_stays_on_the_given_stack() {
        let mut frames = [0; MAX_FRAMES];
        assert_eq!(capture(Leading::NONE, 5, &mut frames, (1 << 20, 2 << 20)), None);
    }
}
