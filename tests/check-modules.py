#!/usr/bin/env python3
"""Checks that no module of a crate imports another that imports it back, directly or around a
longer cycle (README, "Layout"). Reads each crate's src/ as text: a module refers to another
when its code (comments left out) names `crate::<module>` or, inside a folder module,
`super::<sibling>`. A folder's mod.rs may use its children; children may not use mod.rs back.

Usage: tests/check-modules.py <crate>/src ...   (exit 1 on a cycle)
"""

import os
import re
import sys


def code(path):
    text = open(path, encoding="utf-8").read()
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def names_in(group):
    """Top-level names of a `use x::{...}` group: `a`, `b::c` and `d::{e}` give a, b and d."""
    names, depth, current = [], 0, ""
    for ch in group + ",":
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == "," and depth == 0:
            item = current.strip()
            if item:
                names.append(re.split(r"::|\s", item)[0])
            current = ""
        else:
            current += ch
    return names


def references(text, prefix):
    found = set()
    for m in re.finditer(prefix + r"::\{(.*?)\};", text, flags=re.S):
        found.update(names_in(m.group(1)))
    found.update(re.findall(prefix + r"::([a-z_][a-z0-9_]*)", text))
    return found


def graph(files, prefix, name_of):
    edges = {}
    for path in files:
        me = name_of(path)
        refs = references(code(path), prefix)
        edges.setdefault(me, set()).update(r for r in refs if r != me)
    known = set(edges)
    return {m: {r for r in refs if r in known} for m, refs in edges.items()}


def cycle(edges):
    """A cycle of `edges` as a list of modules, or None."""
    state = {}

    def visit(m, path):
        state[m] = "open"
        for n in sorted(edges.get(m, ())):
            if state.get(n) == "open":
                return path[path.index(n):] + [n]
            if n not in state:
                found = visit(n, path + [n])
                if found:
                    return found
        state[m] = "done"
        return None

    for m in sorted(edges):
        if m not in state:
            found = visit(m, [m])
            if found:
                return found
    return None


def main(srcs):
    failed = False
    for src in srcs:
        files = []
        for root, _, names in os.walk(src):
            files += [os.path.join(root, n) for n in names if n.endswith(".rs")]

        def top(path):
            return os.path.relpath(path, src).split(os.sep)[0].removesuffix(".rs")

        crate = graph([f for f in files if top(f) not in ("lib", "main")], r"crate", top)
        checks = [(src, crate)]
        for folder in sorted({os.path.dirname(f) for f in files if os.path.dirname(f) != src}):
            children = [f for f in files if os.path.dirname(f) == folder]
            siblings = graph(
                [f for f in children if not f.endswith("mod.rs")],
                r"super",
                lambda p: os.path.basename(p).removesuffix(".rs"),
            )
            checks.append((folder, siblings))
        for where, edges in checks:
            found = cycle(edges)
            if found:
                print(f"check-modules: {where}: modules import each other: {' -> '.join(found)}",
                      file=sys.stderr)
                failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
