//! [`MemtraceLayer`]: the `tracing_subscriber` layer that makes the spans a sampled allocation
//! happened in the outermost frames of its stack in the trace.
//!
//! The layer only keeps books on application threads, outside the allocator: it interns each
//! new span's description (`span_table`) and keeps its number in the span's extensions (and a
//! small per-thread cache), and on enter and exit pushes and pops that number on the thread's
//! span stack (`spans`), which the allocator's sampled path copies.

use std::cell::Cell;
use std::fmt::{self, Write as _};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing::Subscriber;
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::registry::LookupSpan;

use crate::runtime::{span_table, spans};

/// A [`tracing_subscriber::Layer`] that attributes sampled allocations to the spans they
/// happen in.
///
/// While tracing, every sampled allocation records the spans its thread is inside as the
/// outermost frames of its stack, outermost span first (after the thread's own frame, see
/// [`TraceConfig::thread_frames`](crate::TraceConfig::thread_frames)). A span's frame is an
/// ordinary location, so any memtrace reader opens the trace: its function name is the span's
/// name with the fields chosen with [`with_field`](MemtraceLayer::with_field) (e.g.
/// `http_request{route=/api/users}`), its file name is `<span>` followed by the file of the
/// span's call site, and its line the call site's. Tokio tasks instrumented with
/// `.instrument(span)` are attributed whichever worker polls them: the span is entered for
/// each poll.
///
/// Bounds: a description has at most 200 bytes; one call site has at most 64 distinct
/// descriptions (field values), later ones share `name{…}`, and 65 536 descriptions in all;
/// a sample records at most the 16 outermost spans of its thread. Field values are those given
/// when the span is created (`Span::record` later does not change them).
///
/// ```no_run
/// use tracing_subscriber::prelude::*;
///
/// tracing_subscriber::registry()
///     .with(memtrace_rs::MemtraceLayer::new().with_field("route"))
///     .init();
/// ```
#[derive(Debug, Clone, Default)]
pub struct MemtraceLayer {
    /// The fields that go into span descriptions.
    fields: Vec<String>,
}

impl MemtraceLayer {
    /// A layer that describes spans by their names alone.
    pub fn new() -> MemtraceLayer {
        MemtraceLayer::default()
    }

    /// Describe spans with the field `name` too (when they have it), as `name=value`.
    pub fn with_field(mut self, name: impl Into<String>) -> MemtraceLayer {
        self.fields.push(name.into());
        self
    }
}

/// The description number of a span, kept in its extensions.
struct Described(u32);

impl<S> Layer<S> for MemtraceLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        register_thread();
        let metadata = attrs.metadata();
        let mut description = Description { fields: &self.fields, text: metadata.name().to_owned(), any: false };
        if !self.fields.is_empty() {
            attrs.record(&mut description);
        }
        if description.any {
            description.text.push('}');
        }
        let site = metadata as *const _ as usize;
        let file = metadata.file().unwrap_or("<unknown>");
        let n = span_table::intern(site, metadata.name(), &description.text, file, metadata.line().unwrap_or(0));
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(Described(n));
        }
        cache(id, n);
    }

    fn on_enter(&self, id: &Id, ctx: Context<'_, S>) {
        register_thread();
        if let Some(n) = described(id, &ctx) {
            spans::enter(n);
        }
    }

    fn on_exit(&self, id: &Id, ctx: Context<'_, S>) {
        if let Some(n) = described(id, &ctx) {
            spans::exit(n);
        }
    }
}

/// Slots of the per-thread cache of description numbers.
const CACHE_SLOTS: usize = 64;

thread_local! {
    /// Span ids and their description numbers, recently entered on this thread: a look-up of
    /// the span in the registry (reference counts and a lock on its extensions) costs several
    /// times the registry's own enter. An id is only reused for a new span after its slot's
    /// generation counter wraps, and `on_new_span` overwrites its slot on the creating thread.
    static CACHE: [Cell<(u64, u32)>; CACHE_SLOTS] = const { [const { Cell::new((0, 0)) }; CACHE_SLOTS] };
}

/// The description number of the span `id`.
fn described<S: Subscriber + for<'a> LookupSpan<'a>>(id: &Id, ctx: &Context<'_, S>) -> Option<u32> {
    let key = id.into_u64();
    let slot = key as usize % CACHE_SLOTS;
    if let Ok(Some(n)) = CACHE.try_with(|c| {
        let (cached, n) = c[slot].get();
        (cached == key).then_some(n)
    }) {
        return Some(n);
    }
    let n = ctx.span(id)?.extensions().get::<Described>()?.0;
    cache(id, n);
    Some(n)
}

fn cache(id: &Id, n: u32) {
    let key = id.into_u64();
    let _ = CACHE.try_with(|c| c[key as usize % CACHE_SLOTS].set((key, n)));
}

/// Register this thread's full name the first time it meets a span (the kernel's copy is cut
/// to 15 bytes; this runs outside the allocator, where asking std for it is safe).
fn register_thread() {
    if let Some(tid) = spans::thread_to_register() {
        span_table::register_thread(tid, std::thread::current().name());
    }
}

/// A span description being written: `name{field=value,…}`.
struct Description<'a> {
    fields: &'a [String],
    text: String,
    /// A field has been written (and the braces opened).
    any: bool,
}

impl Description<'_> {
    fn field(&mut self, field: &Field, value: fmt::Arguments<'_>) {
        if !self.fields.iter().any(|f| f == field.name()) {
            return;
        }
        self.text.push(if self.any { ',' } else { '{' });
        self.any = true;
        let _ = write!(self.text, "{}={value}", field.name());
    }
}

impl Visit for Description<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.field(field, format_args!("{value}"));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.field(field, format_args!("{value:?}"));
    }
}
