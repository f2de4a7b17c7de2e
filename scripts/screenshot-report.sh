#!/usr/bin/env bash
# Refresh docs/report.png, the README's picture of `memtrace report`: trace the sample app,
# make its report page and photograph it with headless Chromium.
#   scripts/screenshot-report.sh [OUTPUT.png]      (default docs/report.png)
# Needs chromium (Debian's `chromium` package) and a release build of the sample app and the CLI.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-docs/report.png}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cargo build --quiet --release --example sample-app
cargo build --quiet --release --features cli --bin memtrace
MEMTRACE_FILE="$work/trace.ctf" target/release/examples/sample-app >/dev/null
target/release/memtrace report "$work/trace.ctf" -o "$work/report.html"

# The page draws itself from data its script inflates after the load event: the virtual time
# budget lets that script finish before the picture is taken.
chromium --headless --no-sandbox --disable-gpu --disable-background-networking \
  --disable-component-update --disable-sync --no-first-run --hide-scrollbars \
  --user-data-dir="$work/profile" --window-size=1280,900 --virtual-time-budget=10000 \
  --screenshot="$work/report.png" "file://$work/report.html" 2>"$work/chromium.log" ||
  { cat "$work/chromium.log" >&2; exit 1; }
cp "$work/report.png" "$out"
echo "wrote $out"
