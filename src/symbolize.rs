//! Turning captured frame addresses into source [`Location`]s.
//!
//! Runs on the writer thread (and once at start-up for calibration), never inside an
//! allocation: resolving parses debug info and allocates heavily.
//!
//! Every address we capture is a return address (the instruction after a call), including
//! the innermost one kept: it is the return address of the call into the global allocator.
//! `backtrace::resolve` already looks up `addr − 1` for any non-null address (backtrace-rs
//! `symbolize::adjust_ip`), which lands inside the call instruction, so we pass the return
//! address unchanged; subtracting 1 here as well would be wrong only rarely, but wrong.

use std::ffi::c_void;
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;

use crate::location_codec::Location;

/// The locations of the code at return address `addr`, outermost first: one per inlined
/// function, then the function that contains the code. An address with no symbol gives one
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
    // backtrace::resolve reports the innermost inlined function first.
    locations.reverse();
    locations.into()
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
        (ip, line)
    }

    #[test]
    fn resolves_return_addresses_to_the_call_line() {
        let (ip, line) = known_caller();
        assert_ne!(ip, 0, "caller frame not found");
        let locations = symbolize(ip);
        let inner = locations.last().unwrap();
        assert!(inner.defname_str().ends_with("symbolize::tests::known_caller"), "{inner:?}");
        assert!(inner.filename_str().ends_with("symbolize.rs"), "{inner:?}");
        assert_eq!(inner.line, line);
        assert!(!inner.defname_str().contains("::h"), "hash not stripped: {inner:?}");
    }

    #[test]
    fn unknown_addresses_get_a_placeholder() {
        let locations = symbolize(8);
        assert_eq!(locations.len(), 1);
        assert_eq!(locations[0].defname_str(), "0x8");
    }
}
