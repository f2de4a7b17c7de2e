//! Fuzz the trace reader: any input must end in `Ok` or `Err`, never a panic, a hang or an
//! unbounded allocation. Run with `cargo +nightly fuzz run read_trace` (from the crate
//! root); seed the corpus with `tests/data/*.ctf`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use memtrace_rs::trace::{EventKind, Reader};

/// Most location lookups per input, so one input cannot run for minutes.
const MAX_LOOKUPS: u64 = 1 << 20;

fn read(data: &[u8], decode: bool) {
    let Ok(mut reader) = Reader::new(data) else { return };
    reader.set_decode_backtraces(decode);
    let mut lookups = 0u64;
    while let Ok(Some(event)) = reader.next_event() {
        if let EventKind::Alloc(alloc) = event.kind {
            // Frames of the common prefix were looked up with an earlier event.
            let new = alloc.backtrace.get(alloc.common_prefix as usize..).unwrap_or_default();
            for &code in new {
                lookups += 1;
                if lookups > MAX_LOOKUPS || event.locations.get(code).is_err() {
                    break;
                }
            }
        }
    }
    let _ = (reader.warnings(), reader.is_truncated(), reader.bytes_read());
    for (code, _) in reader.locations().iter() {
        let _ = reader.lookup_location_code(code);
    }
}

fuzz_target!(|data: &[u8]| {
    read(data, true);
    read(data, false);
});
