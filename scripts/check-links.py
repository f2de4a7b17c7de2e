#!/usr/bin/env python3
"""Offline link check of the README, the changelog and docs/*.md (run by .ci/run).

Every relative link and image must name a file or directory of the repository, and every
anchor (`#...`, in the same file or another Markdown file) a heading of that file, spelled as
GitHub spells heading anchors. Links to other sites are not fetched. Links inside code (fenced
blocks and `inline code`) are not links.

    scripts/check-links.py [FILE.md ...]      (default: README.md CHANGELOG.md docs/*.md)

Prints one line per broken link and exits 1 if there is any.
"""
import glob
import os
import re
import sys

LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def prose_lines(text):
    """The lines of `text` outside fenced code blocks, with inline code blanked out, numbered."""
    in_fence = False
    for number, line in enumerate(text.split("\n"), 1):
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if not in_fence:
            yield number, re.sub(r"`[^`]*`", "``", line)


def anchors(path):
    """The anchors GitHub gives the headings of the Markdown file at `path`."""
    seen = {}
    result = set()
    with open(path, encoding="utf-8") as f:
        text = f.read()
    in_fence = False
    for line in text.split("\n"):
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if in_fence or not m:
            continue
        slug = m.group(1).lower()
        slug = re.sub(r"<[^>]*>", "", slug)  # inline HTML
        slug = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", slug)  # a link's text only
        slug = re.sub(r"[^\w\- ]", "", slug).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        result.add(slug if count == 0 else f"{slug}-{count}")
    return result


def check(path, root):
    """The broken links of the Markdown file at `path`, and how many links it has."""
    errors = []
    links = 0
    with open(path, encoding="utf-8") as f:
        text = f.read()
    for number, line in prose_lines(text):
        for target in LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...
                continue
            links += 1
            file_part, _, anchor = target.partition("#")
            resolved = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
            where = f"{os.path.relpath(path, root)}:{number}: {target}"
            if not os.path.exists(resolved):
                errors.append(f"{where}: no such file")
            elif anchor:
                if not resolved.endswith(".md") or os.path.isdir(resolved):
                    errors.append(f"{where}: an anchor into a file that is not Markdown")
                elif anchor not in anchors(resolved):
                    errors.append(f"{where}: no heading with this anchor")
    return errors, links


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    files = sys.argv[1:] or [os.path.join(root, f) for f in ["README.md", "CHANGELOG.md"]] + sorted(
        glob.glob(os.path.join(root, "docs", "*.md"))
    )
    results = [check(f, root) for f in files]
    errors = [e for errs, _ in results for e in errs]
    for e in errors:
        print(e)
    links = sum(n for _, n in results)
    print(f"links: {links} relative links in {len(files)} files, {len(errors)} broken", file=sys.stderr)
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
