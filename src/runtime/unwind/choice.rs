//! [`Unwinder`], the capture a user asks for, and [`Walker`], the stack walker that runs.

/// How a sampled allocation's stack is captured.
///
/// Starting a trace resolves [`Auto`](Unwinder::Auto) to one of the others; the trace's
/// runtime parameters name the walker used: `frame-pointers`, `dwarf` (the cached walk) or
/// `libgcc`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Unwinder {
    /// Frame pointers when the program keeps them, DWARF otherwise. The default.
    ///
    /// Tracing starts by capturing a few stacks with both unwinders (the calibration it
    /// needs anyway). When the frame-pointer walk finds every frame the DWARF unwinder finds,
    /// from the allocation up to the C library's start-up code, the program was built with
    /// frame pointers (`-C force-frame-pointers=yes`), and sampling uses
    /// [`Unwinder::FramePointers`]; otherwise it uses [`Unwinder::Dwarf`]. Only the stack that
    /// starts tracing is checked: code reached otherwise that keeps no frame pointers (a C
    /// library calling back into Rust, say) loses frames from the stacks that pass through it.
    #[default]
    Auto = 2,
    /// Unwind with the DWARF call-frame information of the unwind tables: works for any
    /// program that has them (Rust's default).
    ///
    /// On x86_64 Linux with glibc, the stack is walked with the rules of each return address,
    /// worked out from the tables the first time the address is met and cached: cheap once the
    /// program's call sites have been seen (see docs/BENCHMARKS.md). A
    /// stack ends at a frame that needs more than those rules can express (rare: stack
    /// realignment, a signal frame) and at a library whose unwind tables are malformed, which
    /// the cached walk reads checked and never faults on. Every stack is unwound by libgcc's
    /// `_Unwind_Backtrace` on other platforms, if start-up calibration finds the cached walk's
    /// stacks differ from libgcc's (several times slower), and for a sample taken on another
    /// stack (a signal handler's).
    ///
    /// The cached walk finds a library's unwind tables (on a cache miss) through glibc's
    /// lock-free `_dl_find_object` (glibc 2.35 and later), libgcc's unwinder with
    /// `_Unwind_Find_FDE`, which uses it too with libgcc 12 and later. Older C libraries make
    /// both take the dynamic loader's lock, so a sample could deadlock against a thread
    /// inside `dlopen`/`dlclose`; tracing then says so on stderr when it starts
    /// (ALLOCATOR-PITFALLS §3).
    Dwarf = 0,
    /// Walk the frame-pointer chain: the cheapest walker (see docs/BENCHMARKS.md),
    /// and never touches the dynamic loader or an unwinder lock. Needs the program
    /// built with `-C force-frame-pointers=yes` (e.g. `RUSTFLAGS="-C force-frame-pointers=yes"`;
    /// the precompiled std keeps frame pointers since Rust 1.79); a function without one hides
    /// its caller's frame from the stacks that pass through it, and C code that uses the
    /// frame-pointer register for data (calling back into Rust) ends them there or adds stray
    /// frames past it. x86_64 and aarch64 Linux only; elsewhere, or when start-up calibration
    /// finds no usable frame chain, tracing uses [`Unwinder::Dwarf`] and says so on stderr.
    FramePointers = 1,
}

impl Unwinder {
    /// The name used by `MEMTRACE_UNWINDER` and in the trace's runtime parameters.
    pub fn name(self) -> &'static str {
        match self {
            Unwinder::Auto => "auto",
            Unwinder::Dwarf => "dwarf",
            Unwinder::FramePointers => "frame-pointers",
        }
    }
}

/// The stack walkers behind the [`Unwinder`]s (`Walker as usize` indexes the per-walker
/// calibration).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Walker {
    /// libgcc's `_Unwind_Backtrace`, through `backtrace::trace_unsynchronized`.
    Libgcc = 0,
    FramePointers = 1,
    /// The DWARF walk with cached rules ([`cfi`](super::cfi)); libgcc unwinds the samples taken
    /// on another stack.
    Cfi = 2,
}

impl Walker {
    pub(crate) const ALL: [Walker; 3] = [Walker::Libgcc, Walker::FramePointers, Walker::Cfi];

    /// The name in the trace's runtime parameters.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Walker::Libgcc if cfg!(target_vendor = "apple") => "libunwind",
            Walker::Libgcc => "libgcc",
            Walker::FramePointers => "frame-pointers",
            Walker::Cfi => "dwarf",
        }
    }
}
