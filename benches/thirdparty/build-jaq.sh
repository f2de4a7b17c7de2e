#!/usr/bin/env bash
# Builds jaq 2.3.0 (a jq clone, https://crates.io/crates/jaq) with memtrace-rs as its global
# allocator, for benches/processes.rs: its source is fetched from crates.io by cargo, copied to
# OUT (default target/thirdparty of this repository), patched with the two lines a user adds
# (the allocator and `trace_if_requested`), and built in release mode twice, with
# debug = "line-tables-only" and with debug = 1 (OUT/jaq-line-tables-only, OUT/jaq-debug-1), over
# the system allocator: jaq's default `mimalloc` feature is left off, it sets a global allocator of
# its own. A third build (OUT/jaq-mimalloc, line tables) is jaq as its authors ship it, over
# mimalloc: `MemtraceAllocator<mimalloc::MiMalloc>` in place of their `MiMalloc`. With a C
# compiler (`CC`, else `cc`), it also builds OUT/idle-thread.so (idle-thread.c), which the
# harness preloads into untraced runs of jaq to show what a second thread alone costs it.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
out=$(mkdir -p "${1:-$repo/target/thirdparty}" && cd "${1:-$repo/target/thirdparty}" && pwd)
version=2.3.0

mkdir -p "$out/fetch/src"
printf '[package]\nname = "fetch"\nversion = "0.0.0"\nedition = "2021"\n[dependencies]\njaq = "=%s"\n[workspace]\n' \
    "$version" > "$out/fetch/Cargo.toml"
echo 'fn main() {}' > "$out/fetch/src/main.rs"
cargo fetch --quiet --manifest-path "$out/fetch/Cargo.toml"
src=$(find "${CARGO_HOME:-$HOME/.cargo}/registry/src" -maxdepth 2 -type d -name "jaq-$version" | head -n 1)
[ -n "$src" ] || { echo "jaq-$version not found in the cargo registry" >&2; exit 1; }

rm -rf "$out/jaq-src"
cp -r "$src" "$out/jaq-src"
cd "$out/jaq-src"
cat >> src/main.rs <<'RUST'

#[global_allocator]
static MEMTRACE: memtrace_rs::MemtraceAllocator = memtrace_rs::MemtraceAllocator::system();
RUST
sed -i 's/^fn main() -> ExitCode {$/&\n    let _memtrace = memtrace_rs::trace_if_requested();/' src/main.rs
grep -q '_memtrace = memtrace_rs::trace_if_requested' src/main.rs || { echo "main() not found" >&2; exit 1; }
printf '\n[dependencies.memtrace-rs]\npath = "%s"\n\n[workspace]\n' "$repo" >> Cargo.toml

# The mimalloc build's copy: jaq's own allocator replaced by ours over mimalloc.
rm -rf "$out/jaq-src-mimalloc"
cp -r "$out/jaq-src" "$out/jaq-src-mimalloc"
sed -i -e '/^#\[cfg(feature = "mimalloc")\]$/,/^static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;$/d' \
    -e 's/^static MEMTRACE: memtrace_rs::MemtraceAllocator = memtrace_rs::MemtraceAllocator::system();$/static MEMTRACE: memtrace_rs::MemtraceAllocator<mimalloc::MiMalloc> = memtrace_rs::MemtraceAllocator::new(mimalloc::MiMalloc);/' \
    "$out/jaq-src-mimalloc/src/main.rs"
grep -q 'MemtraceAllocator<mimalloc::MiMalloc>' "$out/jaq-src-mimalloc/src/main.rs" || { echo "allocator not replaced" >&2; exit 1; }
! grep -q 'static GLOBAL: mimalloc' "$out/jaq-src-mimalloc/src/main.rs" || { echo "jaq's allocator left in" >&2; exit 1; }

for debug in line-tables-only 1; do
    name=$([ "$debug" = 1 ] && echo debug-1 || echo line-tables-only)
    # Untouched by this repository's .cargo/config.toml (frame pointers): built as users build.
    CARGO_PROFILE_RELEASE_DEBUG=$debug RUSTFLAGS= cargo build --quiet --release --no-default-features \
        --target-dir "$out/jaq-$name"
    ls -l "$out/jaq-$name/release/jaq"
done
(cd "$out/jaq-src-mimalloc" && CARGO_PROFILE_RELEASE_DEBUG=line-tables-only RUSTFLAGS= cargo build --quiet --release \
    --target-dir "$out/jaq-mimalloc")
ls -l "$out/jaq-mimalloc/release/jaq"
rm -f "$out/idle-thread.so"
if command -v "${CC:-cc}" >/dev/null &&
    "${CC:-cc}" -O2 -shared -fPIC -pthread -o "$out/idle-thread.so" "$repo/benches/thirdparty/idle-thread.c"; then
    ls -l "$out/idle-thread.so"
else
    echo "no idle-thread.so (no C compiler, or it failed): the harness's rows with an idle thread are left out" >&2
fi
