#!/usr/bin/env bash
# Builds ripgrep 14.1.1 (a multi-threaded file searcher, https://crates.io/crates/ripgrep) with
# memtrace-rs as its global allocator, for the peak-RSS figure of a multi-threaded program in
# docs/BENCHMARKS.md: its source is fetched from crates.io by cargo, copied to OUT (default
# target/thirdparty of this repository), patched with the two lines a user adds (the allocator
# and `trace_if_requested`; ripgrep's own jemalloc is for musl builds only), and built in
# release mode with debug = "line-tables-only" into OUT/rg/release/rg. Then, for example:
#   /usr/bin/time -f %M OUT/rg/release/rg -c 'fn [a-z_]+\(' ~/.cargo/registry/src/*/ >/dev/null
#   MEMTRACE_FILE=rg.ctf /usr/bin/time -f %M OUT/rg/release/rg -c 'fn [a-z_]+\(' ~/.cargo/registry/src/*/ >/dev/null
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
out=$(mkdir -p "${1:-$repo/target/thirdparty}" && cd "${1:-$repo/target/thirdparty}" && pwd)
version=14.1.1

mkdir -p "$out/fetch-rg/src"
printf '[package]\nname = "fetch"\nversion = "0.0.0"\nedition = "2021"\n[dependencies]\nripgrep = "=%s"\n[workspace]\n' \
    "$version" > "$out/fetch-rg/Cargo.toml"
echo 'fn main() {}' > "$out/fetch-rg/src/main.rs"
cargo fetch --quiet --manifest-path "$out/fetch-rg/Cargo.toml"
src=$(find "${CARGO_HOME:-$HOME/.cargo}/registry/src" -maxdepth 2 -type d -name "ripgrep-$version" | head -n 1)
[ -n "$src" ] || { echo "ripgrep-$version not found in the cargo registry" >&2; exit 1; }

rm -rf "$out/rg-src"
cp -r "$src" "$out/rg-src"
cd "$out/rg-src"
cat >> crates/core/main.rs <<'RUST'

#[cfg(not(all(target_env = "musl", target_pointer_width = "64")))]
#[global_allocator]
static MEMTRACE: memtrace_rs::MemtraceAllocator = memtrace_rs::MemtraceAllocator::system();
RUST
sed -i 's/^fn main() -> ExitCode {$/&\n    let _memtrace = memtrace_rs::trace_if_requested();/' crates/core/main.rs
grep -q '_memtrace = memtrace_rs::trace_if_requested' crates/core/main.rs || { echo "main() not found" >&2; exit 1; }
printf '\n[dependencies.memtrace-rs]\npath = "%s"\ndefault-features = false\n\n[workspace]\n' "$repo" >> Cargo.toml
# Untouched by this repository's .cargo/config.toml (frame pointers): built as users build.
CARGO_PROFILE_RELEASE_DEBUG=line-tables-only RUSTFLAGS= cargo build --quiet --release --target-dir "$out/rg"
ls -l "$out/rg/release/rg"
