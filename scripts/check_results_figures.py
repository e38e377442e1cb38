#!/usr/bin/env python3
"""Check that splitting docs/results.md into topic pages lost no figure.

docs/results.md used to hold every result in one file, in the order the work was done; it is now an index
(the claims table) and topic pages under docs/results/. This script takes every number from the one-file
version (at a git revision, 074fa7e by default) and checks that the new set of files holds each of them at
least as many times as the old file did (a multiset comparison, so a figure that appeared twice and now
appears once is reported). "issue N" labels are not figures (they gave way to what was measured) and are
left out before counting. Link targets in the new files are left out too, so that an anchor's digits never
stand in for a lost figure. It also checks that every relative link in those files reaches a file, and a
heading there when it names one (GitHub's anchors), so that the index's claims lead to their figures.

    python scripts/check_results_figures.py            # exit 1 and the missing numbers if any is lost
    python scripts/check_results_figures.py --rev main # against another revision of the one-file version
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NUMBER = re.compile(r"\d+(?:[.,]\d+)*")  # 3,268 and 0.885 and 2026-12-07's parts: one token per run of digits
ISSUE_LABEL = re.compile(r"\bissues? \d+", flags=re.I)
LINK_TARGET = re.compile(r"\]\([^)]*\)")


def numbers(text: str) -> Counter[str]:
    return Counter(NUMBER.findall(text))


def old_text(rev: str) -> str:
    return subprocess.run(["git", "show", f"{rev}:docs/results.md"], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout


def new_text() -> str:
    files = [ROOT / "docs" / "results.md", *sorted((ROOT / "docs" / "results").glob("*.md"))]
    return "\n".join(LINK_TARGET.sub("]()", f.read_text()) for f in files)


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def broken_links() -> list[str]:
    files = [ROOT / "docs" / "results.md", *sorted((ROOT / "docs" / "results").glob("*.md"))]
    broken = []
    for f in files:
        for target in re.findall(r"\]\(([^)#]*)(?:#([^)]*))?\)", f.read_text()):
            path, frag = target
            if path.startswith(("http://", "https://")):
                continue
            dest = (f.parent / path).resolve() if path else f
            if not dest.exists():
                broken.append(f"{f.relative_to(ROOT)}: {path} does not exist")
            elif frag and dest.suffix == ".md":
                heads = {anchor(h) for h in re.findall(r"^#+ (.*)$", dest.read_text(), flags=re.M)}
                if frag not in heads:
                    broken.append(f"{f.relative_to(ROOT)}: no heading #{frag} in {path or f.name}")
    return broken


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rev", default="074fa7e", help="the revision whose docs/results.md is the one-file version")
    args = parser.parse_args()
    old = numbers(ISSUE_LABEL.sub("", old_text(args.rev)))
    new = numbers(new_text())
    missing = {n: c - new[n] for n, c in old.items() if new[n] < c}
    print(f"old docs/results.md ({args.rev}): {sum(old.values())} numbers, {len(old)} distinct")
    print(f"new docs/results.md + docs/results/*.md: {sum(new.values())} numbers, {len(new)} distinct")
    found = sum(min(c, new[n]) for n, c in old.items())
    print(f"found in the new files: {found} of {sum(old.values())} (counted with multiplicity)")
    broken = broken_links()
    print(f"broken links: {len(broken)}")
    for b in broken:
        print(f"  {b}")
    if missing:
        print("missing (number: how many fewer times it appears):")
        for n, k in sorted(missing.items()):
            print(f"  {n}: {k}")
    return 1 if missing or broken else 0


if __name__ == "__main__":
    sys.exit(main())
