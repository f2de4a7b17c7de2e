//! The profiler that runs inside the traced program.
//!
//! The data flow, bottom up (each module uses only those before it):
//!
//! - [`descriptor`]: the tracer's own descriptors, used only while they hold the files they
//!   were opened on, and the identity of a descriptor's file;
//! - [`state`]: whether tracing is on, the allocator entry points, frame limits, the clock;
//! - [`forked`]: a forked child of a traced process, which says so if it outlives its parent;
//! - [`sampler`]: the per-thread byte countdown that picks the sampled allocations;
//! - [`fork_safe_lock`]: a lock that the fork handlers can release in the child;
//! - [`tracer_thread`]: the tracer's own threads, never sampled, and the doorbell that wakes one;
//! - [`loader`]: the dynamic loader's list of objects, read under a lock that `fork` waits for;
//! - [`sampled_set`]: the lock-free set of live sampled blocks, and the alignment of sampled
//!   blocks that tells a free at once that most blocks were not;
//! - [`late_frees`]: the frees of sampled blocks that found the queue full, for the writer;
//! - [`handoff`]: the bounded queue from application threads to the writer, with its pool of
//!   frame buffers;
//! - [`spans`]: the spans each thread is inside, and the pseudo-frames that record them and
//!   the thread;
//! - [`span_table`]: span descriptions and thread names, and the locations of pseudo-frames;
//! - [`symbolize`]: code addresses to source locations (the writer's, and calibration's);
//! - [`unwind`]: capturing a sampled allocation's stack, and calibrating the walkers;
//! - [`measure`]: exact counts of measured scopes (`testing::measure`): their slots' counters,
//!   the scope current on each thread, the credit of a measured block's allocation and free;
//! - [`record`]: the sampled path of an allocation and of a free;
//! - [`allocator`]: [`MemtraceAllocator`](allocator::MemtraceAllocator), the hot path;
//! - [`series`]: the numbered parts of a file trace, its size limit and the parts kept;
//! - [`window`]: the queue a window's trace leaves the writer through;
//! - [`config`]: [`TraceConfig`](config::TraceConfig), the environment, start errors;
//! - [`trace_file`]: the trace file's descriptor, checked to be the tracer's own before writes;
//! - [`trace_open`]: opening the trace file, and the files it refuses to open as one;
//! - [`live_profile`]: the writer's live profile (live blocks and allocations by stack, the
//!   peak), and the mailbox profiles are asked for through;
//! - [`writer_thread`]: the thread that owns the trace writer;
//! - [`serve`]: the HTTP endpoint: `request`, `response` and `server` (the connections and
//!   their limits, which the session owns), then, after `session`, `control` and `profile`,
//!   `routes`;
//! - [`session`]: starting and stopping, and the process hooks;
//! - [`control`]: control of the running session from code: windows, rate, file, state;
//! - [`profile`]: heap profiles on demand from the running session's writer, encoded as pprof
//!   or folded stacks;
//! - [`start`]: starting a session with its endpoint, from code or from the environment.

pub(crate) mod allocator;
pub(crate) mod config;
pub(crate) mod control;
pub(crate) mod descriptor;
pub(crate) mod fork_safe_lock;
pub(crate) mod forked;
pub(crate) mod handoff;
pub(crate) mod late_frees;
pub(crate) mod live_profile;
pub(crate) mod loader;
pub(crate) mod measure;
pub(crate) mod profile;
pub(crate) mod record;
pub(crate) mod sampled_set;
pub(crate) mod sampler;
pub(crate) mod series;
pub(crate) mod serve;
pub(crate) mod session;
pub(crate) mod span_table;
pub(crate) mod spans;
pub(crate) mod start;
pub(crate) mod state;
pub(crate) mod symbolize;
pub(crate) mod trace_file;
pub(crate) mod trace_open;
pub(crate) mod tracer_thread;
pub(crate) mod unwind;
pub(crate) mod window;
pub(crate) mod writer_thread;
