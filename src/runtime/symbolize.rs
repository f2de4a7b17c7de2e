//! Turning captured frame addresses into source [`Location`]s.
//!
//! Runs on the writer thread (and once at start-up for calibration), never inside an
//! allocation: resolving parses debug info and allocates heavily.
//!
//! Every address we capture is a return address (the instruction after a call), including
//! the innermost one kept: it is the return address of the call into the global allocator (or,
//! when an optimised build inlined the allocator shim into the allocating function, of that
//! function's call into the tracer: the shim's inlined locations are then trimmed).
//! `backtrace::resolve` already looks up `addr − 1` for any non-null address (backtrace-rs
//! `symbolize::adjust_ip`), which lands inside the call instruction, so we pass the return
//! address unchanged; subtracting 1 here as well would be wrong only rarely, but wrong.

use std::ffi::c_void;
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;

use crate::format::location_codec::Location;
pub(crate) use crate::frames::is_allocator_shim;

/// The locations of the code at return address `addr`, outermost first: the function that
/// contains the code, then one per inlined function, without the allocator shim and what is
/// inlined into it when the shim is itself inlined. An address with no symbol gives one
/// location named after the address.
pub fn symbolize(addr: u64) -> Arc<[Location]> {
    let mut locations = Vec::new();
    resolve(addr, |name, symbol| {
        let column = symbol.colno().unwrap_or(0);
        locations.push(Location {
            filename: symbol
                .filename()
                .map_or_else(|| b"<unknown>".to_vec(), |f| f.as_os_str().as_bytes().to_vec())
                .into(),
            line: symbol.lineno().unwrap_or(0),
            start_char: column,
            end_char: column,
            defname: name.into_bytes().into(),
        });
    });
    if locations.is_empty() {
        locations.push(Location {
            filename: b"<unknown>"[..].into(),
            line: 0,
            start_char: 0,
            end_char: 0,
            defname: format!("{addr:#x}").into_bytes().into(),
        });
    }
    drop_inlined_shim(&mut locations);
    // backtrace::resolve reports the innermost inlined function first.
    locations.reverse();
    locations.into()
}

/// Drop, from `locations` (innermost first), the global allocator's shim and what is inlined
/// into it (our allocator's methods), when the shim is itself inlined into the function that
/// allocates. An optimised build may do that in the crate that defines the global allocator;
/// the return address is then the allocating function's call into the tracer, and the
/// innermost kept frame the allocating function's, not the shim's (see `unwind::SHIM`).
fn drop_inlined_shim(locations: &mut Vec<Location>) {
    if let Some(shim) = locations.iter().rposition(|l| is_allocator_shim(&l.defname_str())) {
        if shim + 1 < locations.len() {
            locations.drain(..=shim);
        }
    }
}

/// The demangled names (without hash) of the functions at return address `addr`, innermost
/// first.
pub fn function_names(addr: u64) -> Vec<String> {
    let mut names = Vec::new();
    resolve(addr, |name, _| names.push(name));
    names
}

/// Call `f` with the demangled name and the symbol of every (inlined) function at `addr`.
fn resolve(addr: u64, mut f: impl FnMut(String, &backtrace::Symbol)) {
    backtrace::resolve(addr as usize as *mut c_void, |symbol| {
        let name = symbol.name().map_or_else(|| "??".to_owned(), |n| format!("{n:#}"));
        f(name, symbol);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[inline(never)]
    fn return_address_here() -> u64 {
        let mut ip = 0;
        let mut depth = 0;
        backtrace::trace(|frame| {
            depth += 1;
            // Frame 0 is inside backtrace; the first frame whose function is this test's
            // caller ends the walk.
            if function_names(frame.ip() as u64).iter().any(|n| n.ends_with("known_caller")) {
                ip = frame.ip() as u64;
                return false;
            }
            depth < 64
        });
        ip
    }

    #[inline(never)]
    fn known_caller() -> (u64, u32) {
        let line = line!() + 1;
        let ip = return_address_here();
        // Used after the call, so that an optimised build cannot make it a tail call (which
        // would take this frame off the stack).
        (std::hint::black_box(ip), line)
    }

    #[test]
    fn resolves_return_addresses_to_the_call_line() {
        let (ip, line) = known_caller();
        assert_ne!(ip, 0, "caller frame not found");
        let locations = symbolize(ip);
        let inner = locations.last().unwrap();
        // The full path, or with line-tables-only debug info (release) the bare name.
        let name = inner.defname_str();
        assert!(name.ends_with("symbolize::tests::known_caller") || name == "known_caller", "{inner:?}");
        assert!(inner.filename_str().ends_with("symbolize.rs"), "{inner:?}");
        assert_eq!(inner.line, line);
        assert!(!inner.defname_str().contains("::h"), "hash not stripped: {inner:?}");
    }

    fn location(name: &str) -> Location {
        Location { filename: b"f.rs"[..].into(), line: 1, start_char: 0, end_char: 0, defname: name.as_bytes().into() }
    }

    fn names(locations: &[Location]) -> Vec<String> {
        locations.iter().map(|l| l.defname_str().into_owned()).collect()
    }

    #[test]
    fn an_inlined_allocator_shim_is_dropped() {
        // Innermost first: the shim, with our methods inlined, inlined into `site`.
        let mut inlined: Vec<_> =
            ["sampled<A>", "alloc<std::alloc::System>", "__rust_alloc", "alloc", "site"].map(location).into();
        drop_inlined_shim(&mut inlined);
        assert_eq!(names(&inlined), ["alloc", "site"]);
        let mut full_names: Vec<_> = ["alloc<A>", "__rustc::__rust_realloc", "site"].map(location).into();
        drop_inlined_shim(&mut full_names);
        assert_eq!(names(&full_names), ["site"]);
        // A frame of the shim's own (a failed skip) is kept whole; other code is untouched.
        for kept in [&["alloc<A>", "__rust_alloc_zeroed"][..], &["my__rust_alloc", "site"], &["site"]] {
            let mut locations: Vec<_> = kept.iter().map(|n| location(n)).collect();
            drop_inlined_shim(&mut locations);
            assert_eq!(names(&locations), kept);
        }
    }

    #[test]
    fn unknown_addresses_get_a_placeholder() {
        let locations = symbolize(8);
        assert_eq!(locations.len(), 1);
        assert_eq!(locations[0].defname_str(), "0x8");
    }
}
