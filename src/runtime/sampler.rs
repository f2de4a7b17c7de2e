//! Per-thread sampling decisions: the byte countdown to the next sample point, the geometric
//! draw that refills it (FORMAT.md §12.1) and the small PRNG behind it, plus the thread-local
//! "inside the tracer" flag that makes the tracer's own allocations bypass sampling.
//!
//! Every 8-byte word allocated is a sample point with probability `rate`, independently, so
//! the distance in words between two sample points is geometric with mean `1 / rate`. Each
//! thread keeps a countdown of the bytes left before its next sample point; an allocation of
//! `n` bytes subtracts `n`, and when the countdown reaches zero or below the allocation is
//! sampled, with `nsamples` = the number of sample points it covers (upstream's external
//! allocation sampler, §12.3). Because sample points form a Bernoulli process over the
//! thread's stream of bytes, `Σ nsamples × 8 / rate` is an unbiased estimate of the bytes
//! allocated, for every subset of the allocations (a call site, a thread, ...).
//!
//! A countdown never runs longer than 4 MiB (`CHECKPOINT_BYTES`): a longer distance to the next
//! sample point (rare but for low rates) is cut there, at a checkpoint that samples nothing,
//! and the distance beyond is drawn afresh, which leaves the sample points a Bernoulli process
//! (the geometric distribution is memoryless). At each checkpoint or sample point the thread
//! notices a new session, so a session started after one at a far lower rate samples every
//! thread within 4 MiB of its allocations, not after its old countdown (gigabytes at 1e-9).
//! The bytes a thread allocates between the start of a session and that moment are not
//! sampled (the estimate is unbiased for the bytes allocated after it).
//!
//! A rate change inside a session ([`rerate`]) is an epoch too, but nothing is left unsampled:
//! a thread finds its next point (or checkpoint) at the rate its countdown was drawn at, counts
//! the points of that allocation at that rate and converts them to the new rate's units
//! ([`rescale`]), then draws its countdown at the new rate. Every word is so sampled at some
//! known rate, and each point weighed by the inverse of its rate's probability, which keeps
//! the estimate unbiased across the change (Horvitz-Thompson). A sample's points are in the
//! units of the rate of the epoch [`thread_epoch`] gives, which [`rate_of_epoch`] tells.
//!
//! An allocation that crosses its countdown's point may cover many more: each whole word past
//! the point is a sample point with probability `rate`, so their number is binomial. When few
//! are expected (the common case: a block a fraction of the mean gap long) they are counted
//! one geometric gap at a time, which takes little stack (the sampled path may run on a thread
//! near the end of its stack); from [`LOOP_MEAN_LIMIT`] expected points on, their number is
//! one exact Binomial draw (`rand_distr`: BTPE, a rejection sampler, O(1) whatever the size;
//! an allocation of 2^60 bytes must not walk its 2^57 · rate gaps inside `GlobalAlloc`) and
//! the distance from the last of them to the next point, beyond the block, one geometric draw
//! (memorylessness again). Both ways are exact, so the estimate stays unbiased for every size.
//!
//! The thread state is a `const`-initialised set of [`Cell`]s with no destructor, so
//! touching it never allocates, never registers a TLS destructor and cannot fail except
//! during thread teardown, where `try_with` makes "TLS gone" mean "not sampled".

use std::cell::Cell;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use rand_distr::{Binomial, Distribution};

/// Bytes per word: sample points are counted in 8-byte words.
pub(crate) const WORD_BYTES: u64 = 8;

/// The largest countdown a single draw may produce (keeps `countdown + draw` far from
/// overflowing even for absurdly small rates).
const MAX_DRAW_WORDS: u64 = 1 << 56;

/// The longest countdown: a longer distance to the next sample point is cut at a checkpoint.
const CHECKPOINT_BYTES: i64 = 4 << 20;

/// The expected number of sample points past the countdown's point from which they are counted
/// with one binomial draw rather than one geometric gap at a time (`1 +` that many draws).
const LOOP_MEAN_LIMIT: f64 = 16.0;

/// Identifies the current tracing session's sampling parameters. A thread whose countdown was
/// drawn for another session redraws it at its next sample point or checkpoint.
static EPOCH: AtomicU32 = AtomicU32::new(0);
/// The epoch at which the current session started: later epochs are its rate changes.
static SESSION_EPOCH: AtomicU32 = AtomicU32::new(0);
/// Epochs whose rates are remembered, for samples still queued after a change.
const EPOCH_SLOTS: usize = 16;
/// The rate of each recent epoch (by epoch modulo [`EPOCH_SLOTS`]) as f64 bits, written
/// before the epoch is published.
static RATES: [AtomicU64; EPOCH_SLOTS] = [const { AtomicU64::new(0) }; EPOCH_SLOTS];
/// `1 / ln(1 − rate)` of each recent epoch as f64 bits (0.0 when `rate ≥ 1`).
static LOG_SCALES: [AtomicU64; EPOCH_SLOTS] = [const { AtomicU64::new(0) }; EPOCH_SLOTS];
/// Distinguishes the seeds of threads started in the same nanosecond.
static SEED_COUNTER: AtomicU64 = AtomicU64::new(0);

/// One thread's sampling state.
struct ThreadState {
    /// Bytes left before the next sample point or checkpoint; ≤ 0 means it was reached.
    countdown: Cell<i64>,
    /// The countdown ends at a checkpoint, not at a sample point.
    checkpoint: Cell<bool>,
    /// PRNG state (splitmix64); 0 until the thread is first seeded.
    rng: Cell<u64>,
    /// The [`EPOCH`] the countdown was drawn for.
    epoch: Cell<u32>,
    /// The rate (as f64 bits) the countdown was drawn at.
    rate: Cell<u64>,
    /// Set while the thread runs tracer code (capture, hand-off) or is the writer thread:
    /// its allocations are never sampled.
    in_tracer: Cell<bool>,
    /// Set by [`force_sample`]: the next sample on this thread is a calibration capture.
    calibrating: Cell<bool>,
}

thread_local! {
    static THREAD: ThreadState = const {
        ThreadState {
            countdown: Cell::new(0),
            checkpoint: Cell::new(false),
            rng: Cell::new(0),
            epoch: Cell::new(0),
            rate: Cell::new(0),
            in_tracer: Cell::new(false),
            calibrating: Cell::new(false),
        }
    };
}

/// Start a new sampling session at `rate` (0 < rate ≤ 1): every thread redraws its countdown
/// at its next sample point.
pub(crate) fn configure(rate: f64) {
    let epoch = publish(rate);
    SESSION_EPOCH.store(epoch, Ordering::Release);
}

/// Change the running session's rate to `rate` (0 < rate ≤ 1): every thread finds its next
/// point at its old rate, then draws at the new one (see the module doc). Returns the new
/// epoch.
pub(crate) fn rerate(rate: f64) -> u32 {
    publish(rate)
}

/// Publish `rate` as the next epoch's, and return that epoch.
fn publish(rate: f64) -> u32 {
    let rate = Rate::new(rate);
    let epoch = EPOCH.load(Ordering::Relaxed).wrapping_add(1);
    let slot = epoch as usize % EPOCH_SLOTS;
    RATES[slot].store(rate.p.to_bits(), Ordering::Relaxed);
    LOG_SCALES[slot].store(rate.scale.to_bits(), Ordering::Relaxed);
    EPOCH.store(epoch, Ordering::Release);
    epoch
}

// A sample's message carries its epoch modulo 2^8 (`handoff::Msg`): the same slot.
const _: () = assert!(256 % EPOCH_SLOTS == 0);

/// The rate of `epoch`, one of the last [`EPOCH_SLOTS`] (0.0 before any).
pub(crate) fn rate_of_epoch(epoch: u32) -> f64 {
    f64::from_bits(RATES[epoch as usize % EPOCH_SLOTS].load(Ordering::Acquire))
}

/// The epoch in whose rate's units this thread's last sample points were counted.
pub(crate) fn thread_epoch() -> u32 {
    THREAD.try_with(|t| t.epoch.get()).unwrap_or(0)
}

/// `n` sample points found at rate `from`, in the units of rate `to`, unbiased: the expected
/// value is `n × to / from`. Down, each point is kept with probability `to / from` (a
/// Binomial draw: exactly the points a sampling at `to` would have found); up, `n × to / from`
/// rounded up or down at random by its fraction.
pub(crate) fn rescale(n: u64, from: f64, to: f64, rng: &mut u64) -> u64 {
    if n == 0 || from == to {
        return n;
    }
    if to < from {
        return binomial(n, to / from, rng);
    }
    let scaled = n as f64 * (to / from);
    let whole = scaled.floor();
    let fraction = scaled - whole;
    let up = ((next_u64(rng) >> 11) as f64 * (1.0 / (1u64 << 53) as f64)) < fraction;
    (whole as u64).saturating_add(u64::from(up))
}

/// A sampling rate and the constant of its geometric draws.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rate {
    /// The probability that a word is a sample point, in (0, 1].
    p: f64,
    /// `1 / ln(1 − p)` (negative), or 0 when every word is sampled.
    scale: f64,
}

impl Rate {
    pub(crate) fn new(p: f64) -> Rate {
        Rate { p, scale: if p >= 1.0 { 0.0 } else { 1.0 / (-p).ln_1p() } }
    }
}

/// Account for an allocation of `bytes` on this thread and return how many sample points it
/// covers: 0 (not sampled; the overwhelmingly common case) or more. [`count_down`], then
/// [`sample_points`] when it says so.
#[inline(always)]
pub(crate) fn take(bytes: usize) -> u64 {
    if count_down(bytes) {
        sample_points(bytes)
    } else {
        0
    }
}

/// The hot half of [`take`]: subtract `bytes` from this thread's countdown and say whether it
/// reached a sample point or checkpoint, which [`sample_points`] must then settle. One
/// thread-local decrement and a compare; false when the thread-local storage is gone.
#[inline(always)]
pub(crate) fn count_down(bytes: usize) -> bool {
    THREAD
        .try_with(|t| {
            let left = t.countdown.get().wrapping_sub(bytes as i64);
            t.countdown.set(left);
            left <= 0
        })
        .unwrap_or(false)
}

/// The cold half of [`take`], after [`count_down`] returned true for an allocation of `bytes`:
/// the number of sample points it covers (0 at a checkpoint, inside the tracer, or with the
/// thread-local storage gone), refilling the countdown.
#[inline(always)]
pub(crate) fn sample_points(bytes: usize) -> u64 {
    THREAD.try_with(|t| t.sample_point(t.countdown.get(), bytes)).unwrap_or(0)
}

impl ThreadState {
    /// The countdown reached `left ≤ 0` during an allocation of `bytes`: count the sample
    /// points and refill the countdown (a checkpoint only refills it).
    #[cold]
    #[inline(never)]
    fn sample_point(&self, mut left: i64, bytes: usize) -> u64 {
        let mut rng = self.rng.get();
        if rng == 0 {
            rng = seed(self as *const ThreadState as u64);
        }
        // Epoch first: its acquire load makes its slot's rate at least as new as the epoch.
        let epoch = EPOCH.load(Ordering::Acquire);
        let slot = epoch as usize % EPOCH_SLOTS;
        let rate = Rate {
            p: f64::from_bits(RATES[slot].load(Ordering::Relaxed)),
            scale: f64::from_bits(LOG_SCALES[slot].load(Ordering::Relaxed)),
        };
        let mut checkpoint = self.checkpoint.get();
        let (left, nsamples, checkpoint) = if self.epoch.get() == epoch {
            count_sample_points(left, checkpoint, &mut rng, rate)
        } else if self.rate.get() != 0 && {
            let session = SESSION_EPOCH.load(Ordering::Relaxed);
            self.epoch.get().wrapping_sub(session) < epoch.wrapping_sub(session)
        } {
            // Drawn at an earlier rate of this session: this allocation's points at that rate,
            // in the new rate's units, and from its end a countdown at the new rate.
            let old = Rate::new(f64::from_bits(self.rate.get()));
            let (_, points, _) = count_sample_points(left, checkpoint, &mut rng, old);
            let nsamples = rescale(points, old.p, rate.p, &mut rng);
            let (left, _, checkpoint) =
                count_sample_points((draw_words(&mut rng, rate) * WORD_BYTES) as i64, false, &mut rng, rate);
            (left, nsamples, checkpoint)
        } else {
            // The countdown belongs to an earlier session (maybe another rate): start afresh,
            // as if this allocation were the thread's first.
            left = (draw_words(&mut rng, rate) * WORD_BYTES) as i64 - bytes as i64;
            checkpoint = false;
            count_sample_points(left, checkpoint, &mut rng, rate)
        };
        self.epoch.set(epoch);
        self.rate.set(rate.p.to_bits());
        self.countdown.set(left);
        self.checkpoint.set(checkpoint);
        self.rng.set(rng);
        if self.in_tracer.get() {
            0
        } else {
            nsamples
        }
    }
}

/// Refill a countdown that reached `left ≤ 0` (at a checkpoint if `checkpoint`), returning
/// the new countdown (> 0), the number of sample points crossed (0 when `left > 0`), and
/// whether the new countdown ends at a checkpoint. A countdown longer than
/// [`CHECKPOINT_BYTES`] (`left` itself, too) is cut to end at a checkpoint. O(1) whatever
/// `left`.
pub(crate) fn count_sample_points(mut left: i64, mut checkpoint: bool, rng: &mut u64, rate: Rate) -> (i64, u64, bool) {
    let mut nsamples = 0;
    // The countdown's point is crossed (a sample point, unless a checkpoint), and so are the
    // `past / 8` whole words after it, each a sample point with probability `p`.
    let past = left.unsigned_abs();
    if left <= 0 && (past / WORD_BYTES) as f64 * rate.p >= LOOP_MEAN_LIMIT {
        // The next point is a geometric draw of words beyond the last of them.
        nsamples = !checkpoint as u64 + binomial(past / WORD_BYTES, rate.p, rng);
        left = (draw_words(rng, rate) * WORD_BYTES) as i64 - (past % WORD_BYTES) as i64;
        checkpoint = false;
    }
    while left <= 0 {
        nsamples += !checkpoint as u64;
        left += (draw_words(rng, rate) * WORD_BYTES) as i64;
        checkpoint = false;
    }
    if left > CHECKPOINT_BYTES {
        // The next sample point is further: stop short of it, on the grid of words, once
        // (a huge allocation at a low rate is not walked through checkpoint by checkpoint).
        left -= (((left - CHECKPOINT_BYTES) as u64).div_ceil(WORD_BYTES) * WORD_BYTES) as i64;
        checkpoint = true;
    }
    (left, nsamples, checkpoint)
}

/// How many of `words` independent words are sample points at probability `p`: an exact
/// Binomial(words, p) draw in O(1) expected time.
#[inline(never)]
fn binomial(words: u64, p: f64, rng: &mut u64) -> u64 {
    // `p` is a valid rate, so the distribution always exists.
    Binomial::new(words, p).map_or(0, |b| b.sample(&mut SplitMix(rng)))
}

/// [`next_u64`] as a `rand` generator, for `rand_distr`'s draws.
struct SplitMix<'a>(&'a mut u64);

impl rand_core::TryRng for SplitMix<'_> {
    type Error = Infallible;

    fn try_next_u32(&mut self) -> Result<u32, Infallible> {
        Ok((next_u64(self.0) >> 32) as u32)
    }

    fn try_next_u64(&mut self) -> Result<u64, Infallible> {
        Ok(next_u64(self.0))
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Infallible> {
        for chunk in dst.chunks_mut(8) {
            chunk.copy_from_slice(&next_u64(self.0).to_le_bytes()[..chunk.len()]);
        }
        Ok(())
    }
}

/// A geometric draw (support 1, 2, ...; mean `1 / rate`): the distance in words to the next
/// sample point.
pub(crate) fn draw_words(rng: &mut u64, rate: Rate) -> u64 {
    if rate.scale == 0.0 {
        return 1;
    }
    // Uniform in (0, 1]: P(u ≤ x) = x, so P(draw > m) = P(ln u ≤ m·ln(1 − rate)) = (1 − rate)^m.
    let u = ((next_u64(rng) >> 11) + 1) as f64 * (1.0 / (1u64 << 53) as f64);
    let words = u.ln() * rate.scale;
    if words >= MAX_DRAW_WORDS as f64 {
        MAX_DRAW_WORDS
    } else {
        1 + words as u64
    }
}

/// splitmix64: a small, fast generator that is good for any state, including 0.
pub(crate) fn next_u64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A nonzero per-thread seed from the thread's TLS address, the clock and a global counter.
fn seed(thread_address: u64) -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec; clock_gettime does not allocate.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    let mut s = thread_address
        ^ (ts.tv_sec as u64).rotate_left(32)
        ^ ts.tv_nsec as u64
        ^ SEED_COUNTER.fetch_add(1, Ordering::Relaxed).rotate_left(48);
    next_u64(&mut s) | 1
}

/// Run `f` with this thread marked "inside the tracer", so that allocations made by `f`
/// (the unwinder, the channel) are not sampled. Returns `None` when the thread-local state is
/// gone (thread teardown).
#[inline]
pub(crate) fn in_tracer<R>(f: impl FnOnce() -> R) -> Option<R> {
    let was = THREAD.try_with(|t| t.in_tracer.replace(true)).ok()?;
    let r = f();
    let _ = THREAD.try_with(|t| t.in_tracer.set(was));
    Some(r)
}

/// Mark this thread as permanently inside the tracer (the writer thread), and move its
/// countdown out of reach so that its allocations never take the sampling slow path.
pub(crate) fn enter_tracer_forever() {
    let _ = THREAD.try_with(|t| {
        t.in_tracer.set(true);
        t.countdown.set(i64::MAX);
        t.epoch.set(u32::MAX);
    });
}

/// Make the next allocation on this thread a sample point and mark the capture it produces as
/// a calibration capture (see [`take_calibration_flag`]).
pub(crate) fn force_sample() {
    let _ = THREAD.try_with(|t| {
        t.countdown.set(0);
        t.checkpoint.set(false);
        t.epoch.set(EPOCH.load(Ordering::Acquire));
        t.calibrating.set(true);
    });
}

/// Whether this thread's current sample was forced by [`force_sample`]; clears the flag.
pub(crate) fn take_calibration_flag() -> bool {
    THREAD.try_with(|t| t.calibrating.replace(false)).unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Simulate `count` allocations with sizes from `size` at `rate`; return (bytes, samples).
    fn simulate(rate: f64, count: usize, mut size: impl FnMut(&mut u64) -> u64) -> (u128, u128) {
        let rate = Rate::new(rate);
        let mut rng = 12345;
        let mut sizes = 999;
        let first = (draw_words(&mut rng, rate) * WORD_BYTES) as i64;
        let (mut left, _, mut checkpoint) = count_sample_points(first, false, &mut rng, rate);
        let (mut bytes, mut samples) = (0, 0);
        for _ in 0..count {
            let n = size(&mut sizes);
            bytes += n as u128;
            let (l, s, c) = count_sample_points(left - n as i64, checkpoint, &mut rng, rate);
            (left, checkpoint) = (l, c);
            samples += s as u128;
        }
        (bytes, samples)
    }

    fn assert_unbiased(rate: f64, bytes: u128, samples: u128) {
        let estimate = samples as f64 * WORD_BYTES as f64 / rate;
        // Relative standard error of a Poisson count is 1/sqrt(n); allow 5 of them.
        let tolerance = 5.0 / (samples as f64).sqrt();
        let error = (estimate - bytes as f64).abs() / bytes as f64;
        assert!(error < tolerance, "rate {rate}: estimated {estimate}, actual {bytes} ({error} ≥ {tolerance})");
    }

    #[test]
    fn estimate_is_unbiased_for_mixed_sizes() {
        let (bytes, samples) = simulate(1e-3, 2_000_000, |s| 1 + next_u64(s) % 4096);
        assert!(samples > 100_000);
        assert_unbiased(1e-3, bytes, samples);
    }

    #[test]
    fn estimate_is_unbiased_for_sub_word_sizes() {
        let (bytes, samples) = simulate(0.05, 1_000_000, |_| 3);
        assert_unbiased(0.05, bytes, samples);
    }

    #[test]
    fn estimate_is_unbiased_for_large_blocks() {
        let (bytes, samples) = simulate(1e-4, 20_000, |s| 65_536 + next_u64(s) % 1_000_000);
        assert_unbiased(1e-4, bytes, samples);
    }

    #[test]
    fn estimate_is_unbiased_across_checkpoints() {
        // Sample points 80 MB apart on average, checkpoints every 4 MiB.
        let (bytes, samples) = simulate(1e-7, 800_000, |s| 1 + next_u64(s) % (2 << 20));
        assert!(samples > 5_000, "{samples}");
        assert_unbiased(1e-7, bytes, samples);
        // Blocks larger than a checkpoint's distance.
        let (bytes, samples) = simulate(1e-6, 100_000, |s| 1 + next_u64(s) % (64 << 20));
        assert_unbiased(1e-6, bytes, samples);
    }

    #[test]
    fn estimate_is_unbiased_for_huge_blocks() {
        // Sizes spread over every power of two up to 2^60 bytes, mixed with small ones: each
        // block is counted in O(1) (walking 2^57 · rate gaps would not finish), and the
        // estimate stays within its statistical error, which 10^12-odd samples make tight.
        let log_uniform = |s: &mut u64| {
            let bits = next_u64(s) % 61;
            if bits == 60 {
                1 << 60
            } else {
                (1 << bits) + next_u64(s) % (1 << bits)
            }
        };
        for rate in [1e-5, 1e-3, 0.3, 0.7] {
            let (bytes, samples) = simulate(rate, 20_000, log_uniform);
            assert!(samples > 1 << 40, "rate {rate}: {samples}");
            assert_unbiased(rate, bytes, samples);
        }
        // Small blocks around a few huge ones: the countdown left by a huge block is drawn
        // afresh, so what follows is sampled as usual.
        let mut i = 0u64;
        let (bytes, samples) = simulate(1e-3, 2_000_000, |s| {
            i += 1;
            if i.is_multiple_of(100_000) {
                1 << 40
            } else {
                1 + next_u64(s) % 4096
            }
        });
        assert_unbiased(1e-3, bytes, samples);
    }

    #[test]
    fn a_huge_block_covers_a_binomial_number_of_sample_points() {
        // The countdown's own point plus Binomial(words past it, rate): mean and variance.
        for (bytes, rate) in [(1u64 << 60, 1e-5), (1 << 40, 1e-3), (1 << 20, 0.5), (1 << 12, 1e-3)] {
            let r = Rate::new(rate);
            let mut rng = bytes ^ 77;
            let words = (bytes / WORD_BYTES) as f64;
            let n = 4000;
            let draws: Vec<f64> = (0..n)
                .map(|_| {
                    let (left, samples, _) = count_sample_points(-(bytes as i64), false, &mut rng, r);
                    assert!(left > 0);
                    samples as f64 - 1.0
                })
                .collect();
            let mean = draws.iter().sum::<f64>() / n as f64;
            let variance = draws.iter().map(|d| (d - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
            let (expected_mean, expected_variance) = (words * rate, words * rate * (1.0 - rate));
            let mean_error = (mean - expected_mean).abs() / (expected_variance / n as f64).sqrt();
            assert!(mean_error < 5.0, "{bytes} B at {rate}: mean {mean}, expected {expected_mean}");
            assert!(
                (variance / expected_variance - 1.0).abs() < 0.15,
                "{bytes} B at {rate}: variance {variance}, expected {expected_variance}"
            );
        }
    }

    #[test]
    fn draws_have_geometric_mean() {
        let rate = Rate::new(0.01);
        let mut rng = 7;
        let n = 200_000;
        let total: u64 = (0..n).map(|_| draw_words(&mut rng, rate)).sum();
        let mean = total as f64 / n as f64;
        assert!((mean - 100.0).abs() < 1.5, "mean {mean}");
        assert!((0..10_000).all(|_| draw_words(&mut rng, rate) >= 1));
    }

    #[test]
    fn rate_one_samples_every_word() {
        let mut rng = 1;
        assert_eq!(count_sample_points(8 - 64, false, &mut rng, Rate::new(1.0)), (8, 8, false));
        assert_eq!(count_sample_points(8 - 8, false, &mut rng, Rate::new(1.0)), (8, 1, false));
        assert_eq!(count_sample_points(5, false, &mut rng, Rate::new(1.0)), (5, 0, false));
        // Reaching a checkpoint (left by an earlier, lower rate) samples only the words past it.
        assert_eq!(count_sample_points(8 - 64, true, &mut rng, Rate::new(1.0)), (8, 7, false));
    }

    /// [`configure`] sets process-wide parameters: the tests that call it run one at a time.
    static SESSION_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

    /// Run `f` on a new thread (fresh thread-local state) while no other test configures.
    fn on_fresh_thread(f: impl FnOnce() + Send) {
        let _lock = SESSION_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        std::thread::scope(|s| s.spawn(f).join()).unwrap_or_else(|e| std::panic::resume_unwind(e));
    }

    fn countdown() -> i64 {
        THREAD.with(|t| t.countdown.get())
    }

    /// Samples `take` reports over `calls` allocations of `bytes`.
    fn take_many(calls: usize, bytes: usize) -> u64 {
        (0..calls).map(|_| take(bytes)).sum()
    }

    #[test]
    fn a_new_session_makes_threads_redraw_at_its_rate() {
        on_fresh_thread(|| {
            configure(1.0);
            // A new thread starts at a sample point: every word is one at rate 1.
            assert_eq!(take(64), 8);
            assert_eq!(take(8), 1);
            assert_eq!([take(3), take(3), take(3)], [0, 0, 1]);
            assert!(countdown() > 0 && countdown() <= 8);

            // The countdown left by rate 1 is reached at once, but belongs to the old epoch:
            // it is redrawn at the new rate, as if this allocation were the thread's first
            // (sampled with probability 1e-8).
            configure(1e-8);
            assert_eq!(take(8), 0);
            assert!(countdown() > 8, "countdown {} not redrawn", countdown());

            // From then on the mean distance between samples follows the new rate: 2 TiB
            // (in 1 MiB allocations) at 1e-8 per word hold about 2750 sample points.
            let bytes = 1usize << 20;
            let calls = 2 << 20;
            let samples = take_many(calls, bytes);
            let expected = (calls * bytes) as f64 * 1e-8 / WORD_BYTES as f64;
            let tolerance = 5.0 * expected.sqrt();
            assert!((samples as f64 - expected).abs() < tolerance, "{samples} samples, expected {expected:.0}");
        });
    }

    /// Rate changes inside a session leave the estimate unbiased: each sample's points, in its
    /// epoch's units and weighed by that epoch's rate, sum to the bytes allocated within 5 sigma
    /// (5, not 4: the team's bound of 1e-6 false failures per run), whatever the changes
    /// (between 1e-3 and 1e-1, every few hundred allocations, before a thread's countdown at
    /// the old rate is reached).
    #[test]
    fn rate_changes_inside_a_session_keep_the_estimate_unbiased() {
        on_fresh_thread(|| {
            configure(1e-3);
            let (rates, size) = ([1e-3, 1e-1, 2e-2, 1e-3], 200usize);
            let (mut estimate, mut variance, mut bytes) = (0.0, 0.0, 0.0);
            for round in 0..4000 {
                let rate = rates[round % rates.len()];
                if round > 0 {
                    rerate(rate);
                }
                for _ in 0..300 {
                    let n = take(size);
                    estimate += n as f64 * WORD_BYTES as f64 / rate_of_epoch(thread_epoch());
                    bytes += size as f64;
                    // A word's estimate has variance 8 × (1 − p) / p per byte at its rate p: at
                    // most the lower of the round's and the one before it (whose countdowns
                    // the round's first words finish).
                    let lower = rate.min(rates[(round + rates.len() - 1) % rates.len()]);
                    variance += size as f64 * WORD_BYTES as f64 / lower;
                }
            }
            let sigma = variance.sqrt();
            assert!(
                (estimate - bytes).abs() < 5.0 * sigma,
                "estimate {estimate:.0} of {bytes:.0} bytes (sigma {sigma:.0})"
            );
        });
    }

    /// A rescaled count keeps its expectation, down (a Binomial thinning) and up.
    #[test]
    fn rescale_is_unbiased() {
        let mut rng = 7;
        for (n, from, to) in [(1000u64, 1e-3, 1e-5), (3, 1e-5, 1e-3), (7, 3e-5, 1e-4)] {
            let trials = 20_000;
            let sum: u64 = (0..trials).map(|_| rescale(n, from, to, &mut rng)).sum();
            let mean = n as f64 * to / from;
            // Variance at most the Poisson's mean, or the rounding's 1/4 per draw.
            let sigma = ((mean.max(0.25)) * trials as f64).sqrt();
            assert!((sum as f64 - mean * trials as f64).abs() < 5.0 * sigma, "{n} at {from} to {to}: {sum}");
        }
        assert_eq!(rescale(5, 1e-4, 1e-4, &mut rng), 5);
        assert_eq!(rescale(2, 1e-5, 1e-3, &mut rng), 200);
    }

    #[test]
    fn a_session_after_a_far_lower_rate_samples_from_the_next_checkpoint() {
        on_fresh_thread(|| {
            configure(1e-12);
            assert_eq!(take(8), 0);
            assert!(countdown() <= CHECKPOINT_BYTES, "countdown {}", countdown());
            // At 1e-3, 8 MiB in 4 KiB allocations hold about 1000 sample points: the thread
            // notices the new session at its checkpoint, at most 4 MiB in.
            configure(1e-3);
            let samples = take_many(2048, 4096);
            assert!(samples > 300, "{samples} samples");
        });
    }

    #[test]
    fn inside_the_tracer_take_returns_zero_but_counts_down() {
        on_fresh_thread(|| {
            configure(0.01);
            let _ = take(1); // The first call draws the thread's countdown for this epoch.
            THREAD.with(|t| t.countdown.set(1000));
            let rng = THREAD.with(|t| t.rng.get());
            assert_eq!(in_tracer(|| take(100)), Some(0));
            assert_eq!(countdown(), 900);
            // Crossing sample points inside the tracer: not sampled, but the countdown is
            // refilled (and the generator advanced) as for a sample.
            assert_eq!(in_tracer(|| in_tracer(|| take(10_000))), Some(Some(0)));
            assert!(countdown() > 0);
            assert_ne!(THREAD.with(|t| t.rng.get()), rng);
            // The flag is restored on the way out (nested calls included).
            assert!(!THREAD.with(|t| t.in_tracer.get()));
            THREAD.with(|t| t.countdown.set(8));
            assert!(take(8) >= 1);
        });
    }

    #[test]
    fn force_sample_makes_the_next_allocation_a_sample() {
        on_fresh_thread(|| {
            configure(1e-12);
            assert_eq!(take(8), 0);
            assert_eq!(take_many(1000, 4096), 0);
            force_sample();
            assert!(take(1) >= 1);
            assert!(take_calibration_flag());
            assert!(!take_calibration_flag());
            // Only one: the countdown is redrawn at the session's rate.
            assert_eq!(take_many(1000, 4096), 0);
            // Forced from a countdown of another epoch, too.
            configure(1e-12);
            force_sample();
            assert!(take(1) >= 1);
            assert!(take_calibration_flag());
        });
    }

    #[test]
    fn tiny_rates_do_not_overflow() {
        let mut rng = 3;
        let rate = Rate::new(1e-300);
        let w = draw_words(&mut rng, rate);
        assert!(w <= MAX_DRAW_WORDS);
        let (left, n, checkpoint) = count_sample_points(0, false, &mut rng, rate);
        assert!(left == CHECKPOINT_BYTES && n == 1 && checkpoint);
        let (left, n, checkpoint) = count_sample_points(0, true, &mut rng, rate);
        assert!(left == CHECKPOINT_BYTES && n == 0 && checkpoint);
    }
}
