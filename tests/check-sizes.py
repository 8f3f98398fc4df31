#!/usr/bin/env python3
"""Rooms of one idea: no source file or function past its size (issue 60, CONVENTIONS "Layout").

A Rust or Go source file the repo keeps by hand may hold at most 800 lines, and at most 600
outside its inline tests (a `#[cfg(test)] mod ... { ... }` block); a file of tests alone (a
`tests.rs`, a file in a `tests/` folder of tests, a Go `_test.go`) at most 800; a function at most
100 lines.
Generated files (prost and tonic output, the Go stubs) are not counted. An exception names the
file or the function and says why it is one idea; `tests/sizes-allowed.txt` holds them, one a
line: `path` or `path::function`, then ` # ` and the reason. An exception that no longer
applies fails the check too, so the list only shrinks.

Usage: tests/check-sizes.py [--report]
  --report   print every file and function over the limits, exceptions included, and exit 0
"""

import re
import subprocess
import sys
from pathlib import Path

FILE_LINES = 800
FILE_LINES_WITHOUT_TESTS = 600
FUNCTION_LINES = 100
ALLOWED = Path("tests/sizes-allowed.txt")
GENERATED = re.compile(r"(\.pb\.go$|_grpc\.pb\.go$|/generated/|/gen/)")

RUST_FN = re.compile(
    r"^\s*(pub(\([^)]*\))?\s+)?(default\s+)?(const\s+)?(async\s+)?(unsafe\s+)?"
    r"(extern\s+\"[^\"]*\"\s+)?fn\s+([A-Za-z_][A-Za-z0-9_]*)"
)
GO_FUNC = re.compile(r"^func\s+(\([^)]*\)\s*)?([A-Za-z_][A-Za-z0-9_]*)")
CFG_TEST_MOD = re.compile(r"^\s*#\[cfg\(test\)\]\s*$")


def strip_code(line, state):
    """The line with strings, chars and comments blanked, so braces can be counted.

    `state` carries a block comment or a raw string across lines: returns (code, state).
    """
    out = []
    i = 0
    n = len(line)
    while i < n:
        if state == "block":
            end = line.find("*/", i)
            if end < 0:
                return "".join(out), "block"
            i = end + 2
            state = None
            continue
        if state and state.startswith("raw"):
            closing = '"' + "#" * int(state[3:])
            end = line.find(closing, i)
            if end < 0:
                return "".join(out), state
            i = end + len(closing)
            state = None
            continue
        if state == "str":
            while i < n:
                if line[i] == "\\":
                    i += 2
                    continue
                if line[i] == '"':
                    i += 1
                    state = None
                    break
                i += 1
            continue
        if state == "btick":
            end = line.find("`", i)
            if end < 0:
                return "".join(out), "btick"
            i = end + 1
            state = None
            continue
        c = line[i]
        if line.startswith("//", i):
            break
        if line.startswith("/*", i):
            state = "block"
            i += 2
            continue
        m = re.match(r'b?r(#*)"', line[i:])
        if m and (i == 0 or not (line[i - 1].isalnum() or line[i - 1] == "_")):
            state = "raw" + str(len(m.group(1)))
            i += len(m.group(0))
            continue
        if c == '"':
            state = "str"
            i += 1
            continue
        if c == "`":
            state = "btick"
            i += 1
            continue
        if c == "'":
            # A char literal ('x', '\n', '{'); a lifetime ('a) has no closing quote nearby.
            m = re.match(r"'(\\.[^']*|[^'\\])'", line[i:])
            if m:
                i += len(m.group(0))
                continue
        out.append(c)
        i += 1
    return "".join(out), state


def blocks(lines, starts):
    """For each (line index, name) in `starts`, the index of the line closing its first brace."""
    ends = {}
    stripped = []
    state = None
    for line in lines:
        code, state = strip_code(line, state)
        stripped.append(code)
    for start, name in starts:
        depth = 0
        opened = False
        for j in range(start, len(lines)):
            code = stripped[j]
            if not opened and ";" in code and "{" not in code:
                break  # a declaration without a body (a trait method)
            for ch in code:
                if ch == "{":
                    depth += 1
                    opened = True
                elif ch == "}":
                    depth -= 1
            if opened and depth <= 0:
                ends[(start, name)] = j
                break
    return ends, stripped


def measure(path):
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = text.splitlines()
    rust = path.suffix == ".rs"
    starts = []
    test_blocks = []
    for i, line in enumerate(lines):
        if rust:
            m = RUST_FN.match(line)
            if m:
                starts.append((i, m.group(8)))
            if CFG_TEST_MOD.match(line) and i + 1 < len(lines) and re.match(
                r"^\s*(pub(\([^)]*\))?\s+)?mod\s+\w+\s*\{", lines[i + 1]
            ):
                test_blocks.append((i + 1, "#test"))
        else:
            m = GO_FUNC.match(line)
            if m:
                starts.append((i, m.group(2)))
    ends, _ = blocks(lines, starts + test_blocks)
    functions = []
    for start, name in starts:
        end = ends.get((start, name))
        if end is not None:
            functions.append((name, start + 1, end - start + 1))
    inline_tests = sum(
        ends[(s, n)] - s + 2 for s, n in test_blocks if (s, n) in ends
    )
    return len(lines), len(lines) - inline_tests, functions


def is_tests(path):
    """Whether the whole file is tests (the test-support crate `tests/src` is not)."""
    parts = path.parts
    if path.name == "tests.rs" or path.name.endswith("_test.go"):
        return True
    return "tests" in parts[:-1] and parts[:2] != ("tests", "src")


def sources():
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.rs", "*.go"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    return [Path(f) for f in files if not GENERATED.search(f) and Path(f).exists()]


def main():
    report = "--report" in sys.argv[1:]
    allowed = {}
    if ALLOWED.exists():
        for raw in ALLOWED.read_text().splitlines():
            entry = raw.split(" # ", 1)
            if raw.strip() and not raw.startswith("#"):
                allowed[entry[0].strip()] = entry[1].strip() if len(entry) > 1 else ""
    over = []
    used = set()
    for path in sources():
        total, without_tests, functions = measure(path)
        key = str(path)
        if is_tests(path):
            without_tests = 0
        if total > FILE_LINES or without_tests > FILE_LINES_WITHOUT_TESTS:
            over.append((key, f"{total} lines, {without_tests} without inline tests"))
        for name, line, length in functions:
            if length > FUNCTION_LINES:
                over.append((f"{key}::{name}", f"{length} lines at line {line}"))
    failed = False
    for key, what in sorted(over):
        if key in allowed:
            used.add(key)
            if report:
                print(f"{key}: {what} (allowed: {allowed[key]})")
            continue
        print(f"{key}: {what}")
        failed = True
    stale = sorted(set(allowed) - used)
    for key in stale:
        if not report:
            print(f"{key}: listed in {ALLOWED} but within its limits now: remove the line")
        failed = True
    if report:
        return 0
    if failed:
        print(
            f"check-sizes: files at most {FILE_LINES} lines ({FILE_LINES_WITHOUT_TESTS} without "
            f"inline tests), functions at most {FUNCTION_LINES}; split by idea, or name the "
            f"exception in {ALLOWED} with why it is one idea",
            file=sys.stderr,
        )
        return 1
    print("check-sizes: every file and function within its size")
    return 0


if __name__ == "__main__":
    sys.exit(main())
