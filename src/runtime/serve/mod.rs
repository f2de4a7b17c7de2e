//! The built-in HTTP endpoint (`MEMTRACE_HTTP`, [`TraceConfig::http`](crate::TraceConfig::http))
//! and the answers it gives, also to a web framework's handler ([`http_response`]). Each
//! module uses only those before it:
//!
//! - [`request`]: a request's head and parameters, parsed from bytes;
//! - [`response`]: answers, sent whole or streamed in chunks;
//! - [`server`]: the listener and the connections, each on a tracer thread of its own within a
//!   limit, with their timeouts;
//! - [`routes`]: what each path answers (after the session and its control: they take profiles
//!   and windows of the running one, and control it).
//!
//! The session owns the running [`server::Endpoint`] and stops it; `runtime::start` starts it
//! with the routes' handler.

pub(crate) mod request;
pub(crate) mod response;
pub(crate) mod routes;
pub(crate) mod server;

pub use response::HttpResponse;
pub use routes::http_response;
