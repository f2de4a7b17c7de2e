#!/usr/bin/env python3
"""The README's cost table quotes docs/BENCHMARKS.md (run by .ci/run).

Every figure in the table of the README's "What it costs" section (a ratio like 1.034×, a
time like 403 ns or +1.9 ms, a size like +11.6 MiB or 18.1 bytes) must appear, as a number,
in docs/BENCHMARKS.md, so that a re-measurement that updates one file and not the other fails.

    scripts/check-readme-figures.py [README.md [BENCHMARKS.md]]

Prints each figure missing from BENCHMARKS.md and exits 1 if there is any.
"""
import os
import re
import sys

FIGURE = re.compile(r"\d+(?:\.\d+)?(?:×| (?:ns|µs|ms|MiB|bytes))")


def cost_table(readme):
    """The table rows of the README's "What it costs" section, without their last column
    (the command that measures them)."""
    section = re.search(r"^## What it costs\n(.*?)(?=^## )", readme, re.S | re.M)
    if not section:
        sys.exit('README has no "## What it costs" section')
    rows = [line for line in section.group(1).split("\n") if line.startswith("|") and "---" not in line]
    return [row.rsplit("|", 2)[0] for row in rows[1:]]


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    readme_path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "README.md")
    benchmarks_path = sys.argv[2] if len(sys.argv) > 2 else os.path.join(root, "docs", "BENCHMARKS.md")
    with open(readme_path, encoding="utf-8") as f:
        rows = cost_table(f.read())
    with open(benchmarks_path, encoding="utf-8") as f:
        benchmarks = f.read()
    figures = [figure for row in rows for figure in FIGURE.findall(row)]
    if not figures:
        sys.exit("no figure found in the README's cost table")
    # A figure's number, standing alone (BENCHMARKS.md may spell the unit in its heading).
    missing = [f for f in figures if not re.search(rf"(?<![\d.]){re.escape(f.split(' ')[0].rstrip('×'))}(?![\d])", benchmarks)]
    for figure in missing:
        print(f"README's cost table: {figure} is not in {os.path.relpath(benchmarks_path, root)}")
    print(f"figures: {len(figures)} in the README's cost table, {len(missing)} not in BENCHMARKS.md", file=sys.stderr)
    sys.exit(1 if missing else 0)


if __name__ == "__main__":
    main()
