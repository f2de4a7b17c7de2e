//! A test that cannot check what it checks, because something it needs is missing here (a
//! tool, a library, a privilege), says so where cargo shows it, and fails under CI instead:
//! a test that passes without running is one that cannot fail. Included by the unit tests
//! and by both test binaries (`#[path]`), so that there is one rule.

use std::io::Write;

/// The calling test did not check what it checks, for want of `what` (what is missing, and
/// how to get it): under CI (`CI` set: `.ci/run` installs everything the tests need) the test
/// fails; elsewhere a `SKIPPED` line goes to stderr past the test harness's capture, so that
/// cargo shows it whether the test passes or not.
pub fn skip(what: &str) {
    let test = std::thread::current().name().unwrap_or("a test").to_owned();
    assert!(std::env::var_os("CI").is_none(), "{test}: {what}, under CI (.ci/run installs what the tests need)");
    // Straight to the descriptor: what `eprintln!` writes in a test is captured.
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {what}");
}
