//! Write a large synthetic trace, or read one back with the bare reader, to measure the
//! `memtrace` command line against raw reading speed and memory.
//!
//! ```text
//! cargo run --release --example synth-trace -- write big.ctf 2000000
//! cargo run --release --example synth-trace -- read big.ctf
//! ```
//!
//! `write` records the given number of allocations (each freed 1000 allocations later, so
//! the trace has about twice as many events) from 64 distinct 24-frame stacks whose two
//! innermost frames are allocator machinery.

use std::io::BufWriter;
use std::sync::Arc;

use memtrace_rs::trace::Location;
use memtrace_rs::trace::{AllocSource, EventKind, Info, NewAlloc, Reader, Writer};

const STACKS: u64 = 64;
const DEPTH: u64 = 24;
const LIVE: usize = 1000;

fn location(code: u64) -> Arc<[Location]> {
    let defname = match code {
        100 => "__rust_alloc".to_string(),
        101 => "alloc::raw_vec::RawVec<T,A>::grow_one".to_string(),
        n => format!("synth::stack{}::level{}", n / 100 - 2, n % 100),
    };
    Arc::from(vec![Location {
        filename: b"src/synth.rs".to_vec().into(),
        line: code as u32,
        start_char: 1,
        end_char: 10,
        defname: defname.into_bytes().into(),
    }])
}

fn write(path: &str, allocs: u64) -> memtrace_rs::Result<()> {
    let info = Info {
        sample_rate: 1e-4,
        word_size: 64,
        executable_name: b"synth".to_vec(),
        host_name: b"localhost".to_vec(),
        runtime_params: b"synth-trace".to_vec(),
        pid: 1,
        initial_domain: 0,
        start_time: 1_700_000_000_000_000,
        context: None,
    };
    let mut writer = Writer::new(BufWriter::new(std::fs::File::create(path)?), &info)?;
    let mut live = std::collections::VecDeque::with_capacity(LIVE + 1);
    let mut callstack = Vec::with_capacity(DEPTH as usize);
    for i in 0..allocs {
        let time = info.start_time + i;
        let stack = (i * 7919) % STACKS;
        callstack.clear();
        // Innermost first: two allocator frames, then the stack's own frames, then main.
        callstack.extend([100, 101]);
        callstack.extend((2..DEPTH).map(|level| (stack + 2) * 100 + level));
        let alloc = NewAlloc {
            length: 1 + i % 50,
            nsamples: 1 + i % 3,
            source: AllocSource::External,
            callstack: &callstack,
            drop: 0,
        };
        live.push_back(writer.put_alloc(0, time, &alloc, location)?);
        if live.len() > LIVE {
            if let Some(id) = live.pop_front() {
                writer.put_collect(0, time, id)?;
            }
        }
    }
    writer.close()?;
    Ok(())
}

fn read(path: &str) -> memtrace_rs::Result<()> {
    let started = std::time::Instant::now();
    let mut reader = Reader::open(path)?;
    let (mut events, mut allocs, mut frames, mut new_frames) = (0u64, 0u64, 0u64, 0u64);
    while let Some(event) = reader.next_event()? {
        events += 1;
        if let EventKind::Alloc(a) = event.kind {
            allocs += 1;
            frames += a.backtrace.len() as u64;
            new_frames += (a.backtrace.len() as u64).saturating_sub(a.common_prefix);
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let per_alloc = |n: u64| n as f64 / allocs.max(1) as f64;
    println!(
        "{events} events, {frames} frames ({:.1} per alloc, {:.1} new per alloc) in {seconds:.3} s: {:.1} M events/s",
        per_alloc(frames),
        per_alloc(new_frames),
        events as f64 / seconds / 1e6
    );
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["write", path, n] => match n.parse() {
            Ok(n) => write(path, n),
            Err(_) => {
                eprintln!("not a number: {n}");
                std::process::exit(2)
            }
        },
        ["read", path] => read(path),
        _ => {
            eprintln!("usage: synth-trace write FILE ALLOCATIONS | synth-trace read FILE");
            std::process::exit(2)
        }
    };
    if let Err(e) = result {
        eprintln!("synth-trace: {e}");
        std::process::exit(1);
    }
}
