#!/usr/bin/env python3
"""The walkthrough "One event, from the watch to the ack" (dispatcher/README.md) stays true.

Every file it names exists and is named once, at most eight of them; every `Type::function` it
names is a function defined in an `impl` of that type somewhere in the workspace's sources, and
every `function` it names with no type (`reconcile_one`) is defined. Exits 1 with what is stale.
"""

import re
import subprocess
import sys
from pathlib import Path

README = Path("dispatcher/README.md")
HEADING = "## One event, from the watch to the ack"
MAX_FILES = 8


def section():
    text = README.read_text()
    start = text.index(HEADING)
    end = text.find("\n## ", start + len(HEADING))
    return text[start : end if end >= 0 else len(text)]


def sources():
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.rs"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    return {f: Path(f).read_text(errors="replace") for f in out if Path(f).exists()}


def main():
    text = section()
    problems = []
    named = re.findall(r"\*\*`([\w./-]+\.rs)`\*\*", text)
    for path in sorted(set(named)):
        if not Path(path).is_file():
            problems.append(f"{path}: no such file")
        if named.count(path) > 1:
            problems.append(f"{path}: named {named.count(path)} times")
    if len(set(named)) > MAX_FILES:
        problems.append(f"{len(set(named))} files named; the path must touch at most {MAX_FILES}")
    code = sources()
    for typ, fn in sorted(set(re.findall(r"`([A-Z]\w*)::([a-z_]\w*)`", text)) - {("Type", "function")}):
        defined = re.compile(r"\bfn\s+" + fn + r"\b")
        owner = re.compile(r"\bimpl\b[^{;]*\b" + typ + r"\b")
        if not any(defined.search(src) and owner.search(src) for src in code.values()):
            problems.append(f"`{typ}::{fn}`: no fn {fn} in an impl of {typ}")
    for fn in sorted(set(re.findall(r"`([a-z_][a-z0-9_]*)`", text))):
        if "_" in fn and not any(re.search(r"\bfn\s+" + fn + r"\b", s) for s in code.values()):
            problems.append(f"`{fn}`: no such function")
    if problems:
        print(f"check-walkthrough: {README}, \"{HEADING[3:]}\", is stale:", file=sys.stderr)
        for p in problems:
            print(f"  {p}", file=sys.stderr)
        return 1
    print(f"check-walkthrough: {len(set(named))} files and every function named exist")
    return 0


if __name__ == "__main__":
    sys.exit(main())
