#!/usr/bin/env bash
# Refresh docs/report.png, the README's picture of `memtrace report`: trace the sample app,
# make its report page and photograph it with headless Chromium.
#   scripts/screenshot-report.sh [OUTPUT.png [TRACE.ctf]]   (default docs/report.png, a new
#                                                          trace of the sample app)
# Needs chromium (Debian's `chromium` package) and a release build of the sample app and the CLI
# (in $CARGO_TARGET_DIR when it is set).
set -euo pipefail
out=$(realpath -m "${1:-$(dirname "$0")/../docs/report.png}")
trace=${2:+$(realpath "$2")}
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-target}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cargo build --quiet --release --features cli --bin memtrace
if [ -z "$trace" ]; then
  cargo build --quiet --release --example sample-app
  trace="$work/trace.ctf"
  MEMTRACE_FILE="$trace" "$target/release/examples/sample-app" >/dev/null
fi
"$target/release/memtrace" report "$trace" -o "$work/report.html"

# The page draws itself from data its script inflates after the load event: without a
# virtual time budget the picture is taken at "Loading…". The budget lets the script finish
# (virtual time runs as fast as the page's work allows).
chromium --headless --no-sandbox --disable-gpu --disable-background-networking \
  --disable-component-update --disable-sync --no-first-run --hide-scrollbars \
  --user-data-dir="$work/profile" --window-size=1280,900 --virtual-time-budget=10000 \
  --screenshot="$work/report.png" "file://$work/report.html" 2>"$work/chromium.log" ||
  { cat "$work/chromium.log" >&2; exit 1; }
cp "$work/report.png" "$out"
echo "wrote $out"
