//! `memtrace diff` against sampling noise: traces of one program sampled independently
//! differ within the noise, a real regression stands out, and `--fail-above` turns that into
//! the exit status a CI gate needs.
use std::path::Path;

use crate::util::cli::*;

/// A tiny xorshift generator, so that every trace can be rebuilt from its seed.
struct XorShift(u64);

impl XorShift {
    fn uniform(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }

    /// A Poisson draw of mean `mean` (by inversion; fine for means of a few hundred).
    fn poisson(&mut self, mean: f64) -> u64 {
        let (mut k, mut p) = (0, (-mean).exp());
        let (mut cdf, u) = (p, self.uniform());
        while u > cdf {
            k += 1;
            p *= mean / k as f64;
            cdf += p;
        }
        k
    }
}

/// A trace of a program whose `parse` and `load` receive `parse` and `load` samples on
/// average, as sampling with seed `seed` gave them (one sample per allocation).
fn sampled_trace(seed: u64, parse: f64, load: f64) -> Vec<u8> {
    let mut rng = XorShift(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let mut t = TraceBuilder::new();
    let mut at = 0;
    for (mean, stack) in [(parse, &PARSE[..]), (load, &LOAD[..])] {
        for _ in 0..rng.poisson(mean) {
            at += 1;
            t.alloc(at, 1, stack);
        }
    }
    t.finish()
}

fn diff(dir: &Path, new: &str, limit: &str) -> Run {
    memtrace(dir, &["diff", "base.ctf", new, "--fail-above", limit])
}

#[test]
fn fail_above_separates_a_regression_from_noise() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    write_trace(dir, "base.ctf", &sampled_trace(1, 400.0, 100.0));
    for seed in 2..12 {
        write_trace(dir, &format!("noise-{seed}.ctf"), &sampled_trace(seed, 400.0, 100.0));
    }
    // `parse` allocates half as much again: 200 samples more on a total of 500.
    write_trace(dir, "regression.ctf", &sampled_trace(12, 600.0, 100.0));

    for seed in 2..12 {
        let run = diff(dir, &format!("noise-{seed}.ctf"), "10%");
        assert_eq!(run.status.code(), Some(0), "seed {seed}: {}{}", run.stdout, run.stderr);
        assert!(run.stderr.is_empty(), "{}", run.stderr);
    }
    for limit in ["10%", "50KiB", "0"] {
        let run = diff(dir, "regression.ctf", limit);
        assert_eq!(run.status.code(), Some(3), "{limit}: {}{}", run.stdout, run.stderr);
        assert_eq!(run.stderr.lines().count(), 1, "{}", run.stderr);
        assert!(run.stderr.starts_with("memtrace: regression.ctf: bytes allocated grew by"), "{}", run.stderr);
    }
    // Growth of about 40 % passes a limit of 60 %; a limit in bytes above it too.
    assert_eq!(diff(dir, "regression.ctf", "60%").status.code(), Some(0));
    assert_eq!(diff(dir, "regression.ctf", "1MiB").status.code(), Some(0));
    let bad = memtrace(dir, &["diff", "base.ctf", "regression.ctf", "--fail-above", "lots"]);
    assert_eq!(bad.status.code(), Some(2), "{}", bad.stderr);
}

#[test]
fn changes_beyond_noise_come_first() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    // `parse` doubles (beyond the noise); `load` only moves by what its sampling gave it,
    // and ranks after `parse` whatever the size of its change.
    write_trace(dir, "base.ctf", &sampled_trace(1, 100.0, 400.0));
    write_trace(dir, "new.ctf", &sampled_trace(2, 200.0, 400.0));
    let text = memtrace_ok(dir, &["diff", "base.ctf", "new.ctf"]);
    let rows: Vec<&str> = text.lines().skip(2).collect();
    assert!(rows[0].ends_with("app::parse (src/app.rs:40)"), "{text}");
    assert!(rows[1].ends_with("app::load (src/app.rs:30)  (within noise)"), "{text}");
    assert!(text.lines().next().unwrap().contains("2 sites changed, 1 beyond the sampling noise"), "{text}");
}

#[test]
fn per_second_compares_rates() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    // The same allocations spread over 70 µs and over 140 µs: half the rate.
    let build = |stretch: u64| {
        let mut t = TraceBuilder::new();
        for i in 0..50 {
            t.alloc(stretch * (i + 1) * 7 / 5, 4, &PARSE);
        }
        t.finish()
    };
    write_trace(dir, "base.ctf", &build(1));
    write_trace(dir, "slow.ctf", &build(2));
    let bytes = memtrace_ok(dir, &["diff", "base.ctf", "slow.ctf"]);
    assert!(bytes.contains("0 sites changed"), "{bytes}");
    let rates = memtrace_ok(dir, &["diff", "base.ctf", "slow.ctf", "--per-second"]);
    assert!(rates.contains("bytes allocated per second") && rates.contains("/s"), "{rates}");
    assert!(rates.contains("1 sites changed, 1 beyond the sampling noise"), "{rates}");
}

/// How many sites [`many_sites_trace`] has.
const SITES: u64 = 40;

/// A trace of a program of [`SITES`] sites, site `k` receiving `60 + 10 k` samples on average
/// (`2000 × growth` for site 0), as sampling with seed `seed` gave them.
fn many_sites_trace(seed: u64, growth: f64) -> Vec<u8> {
    let mut rng = XorShift(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let mut t = TraceBuilder::new();
    let mut at = 0;
    for site in 0..SITES {
        // Site 0's mean is past what inversion draws in f64: a sum of four draws.
        let samples = match site {
            0 => (0..4).map(|_| rng.poisson(500.0 * growth)).sum(),
            k => rng.poisson(60.0 + 10.0 * k as f64),
        };
        let location = |_| location_on_line(&format!("app::site{site}"), "src/app.rs", site as u32 + 1);
        for _ in 0..samples {
            at += 1;
            t.alloc_with(at, 1, &[100 + site], location);
        }
    }
    t.finish()
}

/// The number of sites that `diff` of `base` and `new` (in `dir`) flags beyond the noise.
fn flagged(dir: &Path, base: &str, new: &str) -> u64 {
    let json = memtrace_ok(dir, &["diff", base, new, "--format", "json"]);
    serde_json::from_str::<serde_json::Value>(&json).unwrap()["beyond_noise"].as_u64().unwrap()
}

/// Twenty pairs of runs of one program of 40 sites, sampled with seeds of their own: each
/// row's margin allows for the 40 rows (`FAMILY_ERROR`, 5 %, over all of them), so at most one
/// pair flags anything; a 30 % growth of one site is still flagged, and alone. Fixed seeds
/// make the outcome certain: with independent seeds and a family-wise rate of exactly 5 %,
/// two flagging pairs of 20 would come 26 % of the time (1 - 0.95^20 - 20 × 0.05 × 0.95^19);
/// each row on its own 95 % margin flags some row in 1 - 0.95^40 = 87 % of the pairs.
#[test]
fn runs_of_one_program_differ_within_the_noise_of_all_their_rows() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let mut flagging_pairs = Vec::new();
    for pair in 0..20 {
        write_trace(dir, "a.ctf", &many_sites_trace(2 * pair + 101, 1.0));
        write_trace(dir, "b.ctf", &many_sites_trace(2 * pair + 102, 1.0));
        let n = flagged(dir, "a.ctf", "b.ctf");
        if n > 0 {
            flagging_pairs.push((pair, n));
        }
    }
    assert!(flagging_pairs.len() <= 1, "pairs flagging rows (pair, rows): {flagging_pairs:?}");
    write_trace(dir, "grown.ctf", &many_sites_trace(99, 1.3));
    assert_eq!(flagged(dir, "a.ctf", "grown.ctf"), 1);
    let json = memtrace_ok(dir, &["diff", "a.ctf", "grown.ctf", "--format", "json"]);
    let doc: serde_json::Value = serde_json::from_str(&json).unwrap();
    let first = &doc["changes"][0];
    assert_eq!(first["frames"][0], "app::site0 (src/app.rs:1)", "{json}");
    // Its margin is Holm's first step over the 40 sites (two-sided 5 %/40: 3.23 deviations),
    // not a lone 95 % margin (1.96).
    let samples = |side: &str| first[side]["samples"].as_f64().unwrap();
    let per_sample = first["base"]["value"].as_f64().unwrap() / samples("base");
    let deviation = per_sample * (samples("base") + samples("new")).sqrt();
    let z = first["margin"].as_f64().unwrap() / deviation;
    assert!((z - 3.23).abs() < 0.01, "{z} deviations: {first}");
}
