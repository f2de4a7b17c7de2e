//! The leading frames of every capture that belong to the tracer: per walker and entry point,
//! a count of frames and the allocator shim's address, measured by calibration and read by
//! every capture.

use std::sync::atomic::{AtomicU64, AtomicUsize};

/// Per [`Walker`](super::Walker) and [`Entry`](crate::runtime::state::Entry): leading captured
/// frames that belong to the tracer and the unwinder, below the allocator shim's frame
/// (measured by [`calibrate`](mod@super::calibrate)).
#[allow(clippy::declare_interior_mutable_const)] // Only used to initialise `SKIP`.
const NO_SKIP: [AtomicUsize; 3] = [AtomicUsize::new(0), AtomicUsize::new(0), AtomicUsize::new(0)];
pub(crate) static SKIP: [[AtomicUsize; 3]; 3] = [NO_SKIP, NO_SKIP, NO_SKIP];
/// Per [`Walker`](super::Walker) and [`Entry`](crate::runtime::state::Entry): the address, in
/// the allocator shim (`__rust_alloc` and co., with the global allocator's methods inlined), at
/// which it calls into the tracer; 0 when calibration saw no shim frame. The frame after the [`SKIP`] ones is dropped too when it is
/// at that address: the shim's own frame. In an optimised build LLVM may inline the shim into
/// a function of the crate that defines the global allocator; the frame of that function is at
/// another address, and is kept (the writer trims the shim's inlined locations from it). With
/// LTO the shim may also be inlined into the calibration's marker functions (no shim frame to
/// see) yet called out of line elsewhere: the writer drops such a frame, whose outermost
/// location is the shim.
#[allow(clippy::declare_interior_mutable_const)] // Only used to initialise `SHIM`.
const NO_SHIM: [AtomicU64; 3] = [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)];
pub(crate) static SHIM: [[AtomicU64; 3]; 3] = [NO_SHIM, NO_SHIM, NO_SHIM];
/// The leading frames of a capture that are dropped: `tracer` frames, then one more if it is at
/// the address `shim` (see [`SHIM`]).
#[derive(Clone, Copy)]
pub(crate) struct Leading {
    pub(crate) tracer: usize,
    pub(crate) shim: u64,
}

impl Leading {
    /// Drop nothing (return addresses are never 0).
    pub(crate) const NONE: Leading = Leading { tracer: 0, shim: 0 };

    /// Whether the frame at `index` (innermost first), at address `ip`, is dropped.
    #[inline(always)]
    pub(crate) fn drops(self, index: usize, ip: u64) -> bool {
        index < self.tracer || (index == self.tracer && ip == self.shim)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shim_frame_is_dropped_only_at_its_own_address() {
        let leading = Leading { tracer: 2, shim: 0x50 };
        let kept = |frames: &[u64]| -> Vec<u64> {
            frames.iter().enumerate().filter(|&(i, &ip)| !leading.drops(i, ip)).map(|(_, &ip)| ip).collect()
        };
        // Tracer, tracer, the shim's own frame, the allocating function, its caller.
        assert_eq!(kept(&[0x10, 0x20, 0x50, 0x60, 0x70]), [0x60, 0x70]);
        // The shim inlined into the allocating function: its frame is at another address.
        assert_eq!(kept(&[0x10, 0x20, 0x61, 0x70]), [0x61, 0x70]);
        // The shim's address further out is a frame like any other.
        assert_eq!(kept(&[0x10, 0x20, 0x61, 0x50]), [0x61, 0x50]);
        assert!(!Leading::NONE.drops(0, 0x50));
    }
}
