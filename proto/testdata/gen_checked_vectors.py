#!/usr/bin/env python3
"""Writes checked_vectors.json: the memo in which a reconcile records the versions of its
children that hold its desired state (the Rust SDK's children::Checked, the Go SDK's
dispatch.Checked), as both SDKs must write and read it. Run: python3 gen_checked_vectors.py

Format: byte 1 (the format), then the fingerprint of the desired state, then one fingerprint
per child recorded, in the order recorded, each once. A fingerprint is the first 8 bytes of the
SHA-256 of its parts, each part followed by a zero byte: the desired state alone; a child's
group, kind, name and resourceVersion.
"""
import hashlib
import json
import os


def fingerprint(*parts):
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode() + b"\0")
    return h.digest()[:8]


def case(name, desired, children):
    memo = bytes([1]) + fingerprint(desired)
    seen = []
    for c in children:
        print_ = fingerprint(c["group"], c["kind"], c["name"], c["resource_version"])
        if print_ not in seen:
            seen.append(print_)
    memo += b"".join(seen)
    return {"name": name, "desired": desired, "children": children, "memo_hex": memo.hex()}


def child(group, kind, name, resource_version):
    return {"group": group, "kind": kind, "name": name, "resource_version": resource_version}


CASES = [
    case("no children recorded", "1", []),
    case("a ConfigMap and a Secret", "7", [
        child("", "ConfigMap", "web-config", "1042"),
        child("", "Secret", "web-tls", "1043"),
    ]),
    case("a child recorded twice counts once", "generation-3", [
        child("apps", "Deployment", "web", "77"),
        child("apps", "Deployment", "web", "77"),
    ]),
    case("another version is another fingerprint", "generation-3", [
        child("apps", "Deployment", "web", "77"),
        child("apps", "Deployment", "web", "78"),
    ]),
]

if __name__ == "__main__":
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "checked_vectors.json"), "w") as f:
        json.dump({"cases": CASES}, f, indent=2)
        f.write("\n")
