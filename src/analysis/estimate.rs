//! The sampling uncertainty of byte estimates.
//!
//! A trace samples each allocated word (OCaml) or each 8 bytes (this crate's allocator)
//! independently with the trace's rate, so the number of samples `n` that a set of
//! allocations received is, to a very good approximation, Poisson-distributed with mean
//! `rate × words`. The 95 % interval of the mean given `n` is the exact (Garwood) Poisson
//! interval: solved for from the Poisson distribution function below [`EXACT_BELOW`]
//! samples, and from Byar's closed-form approximation above (within 0.1 % of the exact
//! bounds there; no statistics crate needed for two bounds). Bytes are the bounds times the
//! bytes one sample stands for. The report page's script (`src/bin/memtrace/report/report.js`,
//! `poisson95`) computes the same interval by the same steps, and its browser test checks
//! that both print the same bounds.
//!
//! The interval is that of one figure taken on its own: the live figure at the peak is the
//! highest of many noisy figures, so it is biased upward beyond what its interval says.

/// Figures with fewer samples than this are marked as unreliable: their interval spans
/// more than about ±60 % of the estimate.
pub const FEW_SAMPLES: u64 = 10;

/// The standard normal quantile of 97.5 %: a two-sided 95 % interval is ±`Z` standard
/// deviations.
pub const Z: f64 = 1.959_963_984_540_054;

/// A byte estimate from a sample count, with its 95 % interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimate {
    /// The samples the estimate rests on.
    pub samples: u64,
    /// The estimate: `samples` times the bytes per sample.
    pub bytes: f64,
    /// The lower end of the 95 % interval.
    pub low: f64,
    /// The upper end of the 95 % interval.
    pub high: f64,
}

impl Estimate {
    /// The estimate for `samples` samples of `bytes_per_sample` bytes each.
    pub fn new(samples: u64, bytes_per_sample: f64) -> Estimate {
        let (low, high) = poisson_interval(samples);
        Estimate {
            samples,
            bytes: samples as f64 * bytes_per_sample,
            low: low * bytes_per_sample,
            high: high * bytes_per_sample,
        }
    }

    /// True when the estimate rests on fewer than [`FEW_SAMPLES`] samples.
    pub fn is_rough(&self) -> bool {
        self.samples < FEW_SAMPLES
    }

    /// The larger distance from the estimate to an end of its interval, relative to the
    /// estimate (`None` for an estimate of zero).
    pub fn relative_error(&self) -> Option<f64> {
        (self.bytes > 0.0).then(|| ((self.high - self.bytes).max(self.bytes - self.low)) / self.bytes)
    }
}

/// Sample counts below which the interval is solved for exactly.
pub const EXACT_BELOW: u64 = 100;

/// The 95 % interval of the mean of a Poisson variable observed as `n`.
pub fn poisson_interval(n: u64) -> (f64, f64) {
    if n < EXACT_BELOW {
        // The mean below which seeing `n` or more has probability 2.5 %, and the one above
        // which seeing `n` or fewer has.
        let low = if n == 0 { 0.0 } else { solve(|mean| 1.0 - cdf(n - 1, mean), 0.025, n as f64) };
        let high = solve(|mean| 1.0 - cdf(n, mean), 0.975, 2.0 * n as f64 + 8.0);
        return (low, high);
    }
    let byar = |k: f64, sign: f64| k * (1.0 - 1.0 / (9.0 * k) + sign * Z / (3.0 * k.sqrt())).powi(3);
    let n = n as f64;
    (byar(n, -1.0), byar(n + 1.0, 1.0))
}

/// P(X ≤ k) for X Poisson with mean `mean`.
fn cdf(k: u64, mean: f64) -> f64 {
    let mut term = (-mean).exp();
    let mut sum = term;
    for i in 1..=k {
        term *= mean / i as f64;
        sum += term;
    }
    sum.min(1.0)
}

/// The mean in `[0, max]` at which `f`, increasing in the mean, reaches `target`.
fn solve(f: impl Fn(f64) -> f64, target: f64, max: f64) -> f64 {
    let (mut lo, mut hi) = (0.0, max);
    for _ in 0..100 {
        let mid = (lo + hi) / 2.0;
        if f(mid) < target {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    (lo + hi) / 2.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byar_is_close_to_the_exact_interval() {
        // Exact Garwood bounds (chi-square quantiles) for a few counts.
        for (n, low, high) in
            [(0, 0.0, 3.689), (1, 0.0253, 5.572), (5, 1.624, 11.668), (10, 4.795, 18.390), (100, 81.36, 121.63)]
        {
            let (l, h) = poisson_interval(n);
            assert!((l - low).abs() <= 0.002 * low.max(0.05), "{n}: low {l} vs {low}");
            assert!((h - high).abs() <= 0.002 * high, "{n}: high {h} vs {high}");
        }
    }

    #[test]
    fn estimates_scale_by_the_bytes_per_sample() {
        let e = Estimate::new(100, 800.0);
        assert_eq!(e.bytes, 80_000.0);
        assert!(e.low < e.bytes && e.bytes < e.high);
        assert!((e.relative_error().unwrap() - 0.216).abs() < 0.01, "{e:?}");
        assert!(!e.is_rough() && Estimate::new(9, 1.0).is_rough());
        assert_eq!(Estimate::new(0, 800.0).relative_error(), None);
    }
}
