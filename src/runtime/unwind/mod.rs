//! Capturing the stack of a sampled allocation.
//!
//! Three walkers ([`choice`]): a frame-pointer walk ([`frame_pointers`]), a DWARF walk with a
//! cache of unwind rules ([`cfi`]), and libgcc's DWARF unwinder ([`libgcc`]), which takes the
//! stacks the others cannot walk (a thread's stack bounds unknown, a sample on another stack). [`capture`](fn@capture) runs the session's walker and drops the tracer's
//! leading frames ([`leading`]), which start-up [`calibrate`](mod@calibrate) measures per walker
//! and entry point.
//!
//! Everything here runs inside the tracer (allocations are not sampled) and, on the sampled
//! path, allocates nothing.

pub(crate) mod calibrate;
pub(crate) mod capture;
pub(crate) mod cfi;
pub(crate) mod choice;
pub(crate) mod frame_pointers;
pub(crate) mod leading;
pub(crate) mod libgcc;

pub(crate) use calibrate::{calibrate, calibration_slot, name_start_up_frames, NotGlobalAllocator};
pub(crate) use capture::{capture, configure, stack_left, stack_left_for_capture};
pub use choice::Unwinder;
pub(crate) use choice::Walker;
