//! What the endpoint answers at each path: the heap profiles of `/debug/pprof/…` (GET), for
//! the built-in server and for a web framework's handler ([`http_response`]).

use std::io;
use std::sync::Arc;
use std::time::Duration;

use super::request::params;
use super::response::{self, text, HttpResponse};
use super::server::{Connection, Handler};
use crate::runtime::live_profile::Mailbox;
use crate::runtime::profile::{delta, profile_from, sleep, ProfileError, ProfileKind, MAX_DELTA};
use crate::runtime::session;

/// The built-in server's handler, for the session whose writer takes requests at `mailbox`.
pub(crate) fn handler(mailbox: Mailbox) -> Arc<Handler> {
    Arc::new(move |connection: &Connection<'_>| answer(&mailbox, connection))
}

/// Answer the request of `connection`.
fn answer(mailbox: &Mailbox, connection: &Connection<'_>) -> io::Result<()> {
    let head = &connection.head;
    let response = match head.method.as_str() {
        "GET" => profile_answer(mailbox, &head.path, &head.query, |over| connection.wait(over)),
        _ => text(405, "only GET is served"),
    };
    response::send(connection.stream(), &response)
}

/// The answer to a `GET` of `path_and_query` (`/debug/pprof/heap?seconds=10`), for a web
/// framework's handler to return (see `examples/axum-profiles.rs`); the built-in endpoint
/// (`MEMTRACE_HTTP`) answers the same. Paths: `/debug/pprof/heap` (what is live),
/// `/debug/pprof/allocs` (what was allocated) and `/debug/pprof/peak` (what was live at the
/// peak); `?seconds=N`: the delta over the next N seconds (heap and allocs, waits N
/// seconds); `?format=folded`: folded stacks for a flame graph instead of pprof.
pub fn http_response(path_and_query: &str) -> HttpResponse {
    let (path, query) = path_and_query.split_once('?').unwrap_or((path_and_query, ""));
    match session::profile_mailbox() {
        Some(mailbox) => profile_answer(&mailbox, path, query, sleep),
        None => text(503, "no memtrace session is running"),
    }
}

/// The profile at `path` that `query` asks for, from the writer of `mailbox`, `wait(over)`
/// waiting out a delta's time (false: interrupted).
fn profile_answer(mailbox: &Mailbox, path: &str, query: &str, wait: impl FnOnce(Duration) -> bool) -> HttpResponse {
    let kind = match path.trim_end_matches('/') {
        "/debug/pprof/heap" => ProfileKind::Heap,
        "/debug/pprof/allocs" => ProfileKind::Allocs,
        "/debug/pprof/peak" => ProfileKind::Peak,
        _ => return text(404, "no such profile: try /debug/pprof/heap, /debug/pprof/allocs or /debug/pprof/peak"),
    };
    let (mut seconds, mut folded) = (None, false);
    for (name, value) in params(query) {
        match name {
            "seconds" => match value.parse::<u64>() {
                Ok(n) if n > 0 && Duration::from_secs(n) <= MAX_DELTA => seconds = Some(Duration::from_secs(n)),
                _ => return text(400, "seconds must be a whole number from 1 to 600"),
            },
            "format" if value == "folded" => folded = true,
            "format" if value == "pprof" => folded = false,
            "format" => return text(400, "format must be pprof or folded"),
            // Go's other parameters (gc, debug) mean nothing here.
            _ => {}
        }
    }
    let profile = match seconds {
        Some(over) => delta(mailbox, kind, over, || wait(over)),
        None => profile_from(mailbox, kind),
    };
    match profile {
        Ok(profile) if folded => {
            HttpResponse { status: 200, content_type: "text/plain; charset=utf-8", body: profile.folded().into_bytes() }
        }
        Ok(profile) => HttpResponse { status: 200, content_type: "application/octet-stream", body: profile.pprof() },
        Err(e @ ProfileError::InvalidDelta) => text(400, &e.to_string()),
        Err(e) => text(503, &e.to_string()),
    }
}
