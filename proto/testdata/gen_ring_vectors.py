#!/usr/bin/env python3
"""An independent implementation of keys.md, in Python, that writes ring_vectors.json.

The Rust implementation (proto/src/ring.rs) is tested against its output, so the two must agree
byte for byte. Needs the `xxhash` package from PyPI. Run from the repository root:

    python3 proto/testdata/gen_ring_vectors.py > proto/testdata/ring_vectors.json
"""
import bisect
import json

import xxhash

VIRTUAL_NODES = 128


def hash64(s: str) -> int:
    return xxhash.xxh64_intdigest(s.encode("utf-8"), seed=0)


def ring(members):
    points = {}
    for m in sorted(set(members)):
        for i in range(VIRTUAL_NODES):
            points.setdefault(hash64(f"{m}#{i}"), m)  # on a collision the first member keeps it
    keys = sorted(points)
    return keys, points


def owner(r, key_hash):
    keys, points = r
    i = bisect.bisect_left(keys, key_hash)
    return points[keys[i % len(keys)]]


keys = [
    "/ConfigMap/default/settings",
    "apps/Deployment/web/frontend",
    "/Namespace//kube-system",
    "test.kube-dispatch.dev/Widget/team-a/gear",
] + [f"/ConfigMap/ns-{i % 7}/cm-{i}" for i in range(60)]
rings = [
    ["dispatcher-0"],
    ["dispatcher-0", "dispatcher-1", "dispatcher-2"],
    ["dispatcher-2", "dispatcher-0", "dispatcher-1", "dispatcher-3"],
]
out = {
    "hashes": {k: str(hash64(k)) for k in keys},
    "rings": [
        {"members": members, "owners": {k: owner(ring(members), hash64(k)) for k in keys}}
        for members in rings
    ],
}
print(json.dumps(out, indent=1, sort_keys=True))
