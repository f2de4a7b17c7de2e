#!/usr/bin/env bash
# The README's reader test (run by .ci/run): runs each shell block of README.md marked
# runnable, as a reader would type it, from the repository's root, and fails on the first
# that fails. A block is runnable when the line before its ```sh fence is
#   <!-- runnable -->
# The README's test command is not marked: .ci/run runs it already.
# Files the blocks create at paths that were free before (trace.ctf, report.html), ignored by
# git or not, are removed afterwards, so that the checkout stays as it was.
#   scripts/run-readme-blocks.sh [FILE.md]      (default README.md)
set -euo pipefail
cd "$(dirname "$0")/.."
readme=${1:-README.md}
blocks=$(mktemp -d)
before=$(mktemp)
trap 'rm -rf "$blocks" "$before"' EXIT

# Each runnable block into a file of its own: blocks/1.sh, blocks/2.sh, ...
awk -v dir="$blocks" '
  /^<!-- runnable -->[[:space:]]*$/ { marked = 1; next }
  marked && /^```sh[[:space:]]*$/ { n++; file = dir "/" n ".sh"; inside = 1; marked = 0; next }
  inside && /^```[[:space:]]*$/ { inside = 0; close(file); next }
  inside { print > file; next }
  { marked = 0 }
' "$readme"
count=$(find "$blocks" -name '*.sh' | wc -l)
[ "$count" -gt 0 ] || { echo "no runnable block in $readme" >&2; exit 1; }

# Untracked paths, a directory that is untracked as a whole as one entry (target/).
untracked() { git ls-files --others --directory; }
untracked >"$before"
status=0
for n in $(seq 1 "$count"); do
  echo "--- $readme, runnable block $n of $count:" >&2
  cat "$blocks/$n.sh" >&2
  if ! bash -euo pipefail "$blocks/$n.sh"; then
    echo "--- block $n of $readme failed" >&2
    status=1
    break
  fi
done
untracked | grep -vxFf "$before" | while IFS= read -r made; do
  if [ -f "$made" ]; then rm -f -- "$made"; fi
done || true
exit "$status"
