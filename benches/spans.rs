//! The cost of `MemtraceLayer` on the application's threads: entering and leaving a span, and
//! creating one, against a plain `tracing` subscriber (the registry alone) in the same run.
//!
//! ```sh
//! cargo bench --bench spans --features tracing -- --warm-up-time 1 --measurement-time 3
//! ```
//!
//! The layer's work on enter and exit is a look-up of the span's description number in its
//! extensions and a thread-local push or pop; on creation, formatting the chosen fields and
//! interning the description (a read-locked hash look-up once the description is known).

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use memtrace_rs::MemtraceLayer;
use tracing::{info_span, Dispatch};
use tracing_subscriber::layer::SubscriberExt;

/// The subscribers compared: the registry alone, and the registry with the layer.
fn subscribers() -> [(&'static str, Dispatch); 2] {
    [
        ("registry", Dispatch::new(tracing_subscriber::registry())),
        (
            "registry+memtrace",
            Dispatch::new(tracing_subscriber::registry().with(MemtraceLayer::new().with_field("route"))),
        ),
    ]
}

fn bench_enter_exit(c: &mut Criterion) {
    let mut group = c.benchmark_group("enter_exit");
    for (name, dispatch) in subscribers() {
        tracing::dispatcher::with_default(&dispatch, || {
            let outer = info_span!("http_request", route = "/api/users");
            let _outer = outer.enter();
            let span = info_span!("render");
            group.bench_function(name, |b| {
                b.iter(|| {
                    let _entered = black_box(&span).enter();
                })
            });
        });
    }
    group.finish();
}

fn bench_new_span(c: &mut Criterion) {
    let mut group = c.benchmark_group("new_enter_exit_close");
    for (name, dispatch) in subscribers() {
        tracing::dispatcher::with_default(&dispatch, || {
            group.bench_function(name, |b| {
                b.iter(|| info_span!("http_request", route = black_box("/api/users")).in_scope(|| ()))
            });
        });
    }
    group.finish();
}

criterion_group!(benches, bench_enter_exit, bench_new_span);
criterion_main!(benches);
