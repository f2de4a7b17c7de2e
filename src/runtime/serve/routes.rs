//! What the endpoint answers at each path: the heap profiles of `/debug/pprof/…` (GET), for
//! the built-in server and for a web framework's handler ([`http_response`]); a trace of the
//! next seconds (`GET /debug/memtrace/trace?seconds=N`, streamed); the session's state (`GET
//! /debug/memtrace/state`); and control (`POST /debug/memtrace/start`, `/stop`, `/rate`),
//! for clients on this machine only unless the program opts in, and never a browser's.
//! Nothing here takes a path from the network: a file trace starts at the configured one.

use std::io;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;

use super::request::params;
use super::response::{self, text, Chunked, HttpResponse};
use super::server::{Connection, Handler, Place};
use crate::runtime::config::HTTP_CONTROL_VAR;
use crate::runtime::control::{self, ControlError};
use crate::runtime::live_profile::Mailbox;
use crate::runtime::profile::{delta, profile_from, sleep, ProfileError, ProfileKind, MAX_DELTA};
use crate::runtime::session;

/// The trace of a window.
const TRACE: &str = "/debug/memtrace/trace";
/// The session's state, as JSON.
const STATE: &str = "/debug/memtrace/state";
/// Start the file trace.
const START: &str = "/debug/memtrace/start";
/// Stop the file trace.
const STOP: &str = "/debug/memtrace/stop";
/// Change the rate.
const RATE: &str = "/debug/memtrace/rate";

/// The longest window: a longer one is refused.
const MAX_WINDOW: Duration = Duration::from_secs(600);
/// Windows served at once: each costs the writer a copy of every packet.
const MAX_WINDOWS: usize = 2;

/// The routes of one session's endpoint.
struct Routes {
    /// Where the session's writer takes requests for profiles.
    mailbox: Mailbox,
    /// Whether clients not on this machine may control the session.
    control_from_any_address: bool,
    /// The windows being served.
    windows: Arc<AtomicUsize>,
}

/// The built-in server's handler, for the session whose writer takes requests at `mailbox`;
/// `control_from_any_address`: whether clients not on this machine may control it.
pub(crate) fn handler(mailbox: Mailbox, control_from_any_address: bool) -> Arc<Handler> {
    let routes = Routes { mailbox, control_from_any_address, windows: Arc::new(AtomicUsize::new(0)) };
    Arc::new(move |connection: &Connection<'_>| routes.answer(connection))
}

impl Routes {
    /// Answer the request of `connection`.
    fn answer(&self, connection: &Connection<'_>) -> io::Result<()> {
        let head = &connection.head;
        let path = head.path.trim_end_matches('/');
        let method = match path {
            START | STOP | RATE => "POST",
            _ => "GET",
        };
        let refusal = match method {
            "POST" => control_refusal_of(head.from_browser, connection.from_loopback, self.control_from_any_address),
            _ => None,
        };
        let response = if head.method != method {
            text(405, &format!("{path} takes {method} only"))
        } else if let Some(refusal) = refusal {
            refusal
        } else {
            match path {
                TRACE => return self.trace(connection),
                STATE => match control::session_state() {
                    Some(state) => HttpResponse {
                        status: 200,
                        content_type: "application/json",
                        body: format!("{}\n", state.to_json()).into_bytes(),
                    },
                    None => text(503, "no memtrace session is running, or its writer is busy"),
                },
                START => done(control::start_file_trace().map(|path| format!("tracing into {path:?}"))),
                STOP => done(control::stop_file_trace().map(|path| format!("closed {path:?}"))),
                RATE => match rate_asked(connection) {
                    Some(rate) => done(control::set_rate(rate).map(|()| format!("sampling at rate {rate:e}"))),
                    None => text(400, "give the rate as rate=R, in the query or the body, R in (0, 1]"),
                },
                _ => profile_answer(&self.mailbox, path, &head.query, |over| connection.wait(over)),
            }
        };
        response::send(connection.stream(), &response)
    }

    /// Stream the trace of the window the query asks for (`seconds=N`, optionally `rate=R`).
    /// A window cut short (the session stopped, the client too slow) ends without its last
    /// chunk: the client sees the body incomplete, a trace readable up to there.
    fn trace(&self, connection: &Connection<'_>) -> io::Result<()> {
        let (mut seconds, mut rate) = (None, Ok(None));
        for (name, value) in params(&connection.head.query) {
            match name {
                "seconds" => seconds = value.parse().ok().filter(|n| (1..=MAX_WINDOW.as_secs()).contains(n)),
                "rate" => rate = value.parse::<f64>().map(Some),
                _ => {}
            }
        }
        let (Some(seconds), Ok(rate)) = (seconds, rate) else {
            let why = "give seconds=N, a whole number from 1 to 600, and optionally rate=R, a number in (0, 1]";
            return response::send(connection.stream(), &text(400, why));
        };
        let Some(_window) = Place::take(&self.windows, MAX_WINDOWS) else {
            let busy = format!("{MAX_WINDOWS} windows are being traced already: try later");
            return response::send(connection.stream(), &text(503, &busy));
        };
        let mut out = Chunked::new(connection.stream(), "application/octet-stream");
        match control::trace_window(&mut out, Duration::from_secs(seconds), rate) {
            Ok(_) => out.finish(),
            Err(e) if !out.started() => response::send(connection.stream(), &control_refusal(&e)),
            // Cut short: no last chunk.
            Err(_) => Ok(()),
        }
    }
}

/// Why a control request is refused: a browser's (with an `Origin` header: a page of any site
/// can make one to a loopback address), or one from a client not on this machine unless
/// `from_any_address`.
fn control_refusal_of(from_browser: bool, from_loopback: bool, from_any_address: bool) -> Option<HttpResponse> {
    if from_browser {
        return Some(text(403, "no control from a browser (a request with an Origin header): use curl or code"));
    }
    (!from_loopback && !from_any_address).then(|| {
        text(
            403,
            &format!(
                "control is served to clients on this machine only, unless {HTTP_CONTROL_VAR} is 1 in the program"
            ),
        )
    })
}

/// The rate a `POST` of `/debug/memtrace/rate` asks for: `rate=R` in its query or its form
/// body, or a body that is the number alone.
fn rate_asked(connection: &Connection<'_>) -> Option<f64> {
    let body = std::str::from_utf8(connection.body).ok()?.trim();
    let bare = (!body.is_empty() && !body.contains('=')).then_some(body);
    let mut named = params(&connection.head.query).chain(params(body)).filter(|&(name, _)| name == "rate");
    named.next().map(|(_, value)| value).or(bare)?.parse().ok()
}

/// The answer to a control that did what `outcome` says.
fn done(outcome: Result<String, ControlError>) -> HttpResponse {
    match outcome {
        Ok(message) => text(200, &message),
        Err(e) => control_refusal(&e),
    }
}

/// The answer to a control that failed with `e`.
fn control_refusal(e: &ControlError) -> HttpResponse {
    let status = match e {
        ControlError::InvalidRate(_) => 400,
        ControlError::RateAboveSession { .. } | ControlError::File(_) => 409,
        _ => 503,
    };
    text(status, &e.to_string())
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
        _ => {
            return text(
                404,
                "no such path: try /debug/pprof/heap, /debug/pprof/allocs, /debug/pprof/peak, \
                 /debug/memtrace/trace?seconds=N or /debug/memtrace/state",
            )
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn who_may_control() {
        let refused = |browser, loopback, anywhere| control_refusal_of(browser, loopback, anywhere).map(|r| r.status);
        assert_eq!(refused(false, true, false), None);
        assert_eq!(refused(false, false, true), None);
        assert_eq!(refused(false, false, false), Some(403));
        assert_eq!(refused(true, true, true), Some(403));
    }
}
