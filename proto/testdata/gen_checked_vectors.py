#!/usr/bin/env python3
"""Writes checked_vectors.json: the memo in which a reconcile records the versions of its
children that hold its desired state (the Rust SDK's children::Checked, the Go SDK's
dispatch.Checked), as both SDKs must write and read it. Run: python3 gen_checked_vectors.py

Format: byte 3 (the format), then the fingerprint of the desired state, then for each child
recorded, in the order first recorded, once: the first 6 bytes of the fingerprint of its group,
kind, namespace (empty for a cluster-scoped child) and name, then the newest resourceVersion recorded for it as an unsigned LEB128 varint. A
fingerprint is the first 8 bytes of the SHA-256 of its parts, each part followed by a zero
byte. A resourceVersion that is not a positive decimal integer without leading zeros (the
comparable form of Kubernetes 1.35 and later) is not recorded. Format 2, before, left the
namespace out, so two children of one name in two namespaces (the children of a cluster-scoped
owner) shared one record; a memo in it is not read (its children are read once more).
"""
import hashlib
import json
import os


def fingerprint(*parts):
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode() + b"\0")
    return h.digest()[:8]


def varint(value):
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def comparable(version):
    return (version.isascii() and version.isdigit() and not version.startswith("0")
            and int(version) < 2**64)


def case(name, desired, children):
    memo = bytes([3]) + fingerprint(desired)
    recorded = {}
    for c in children:
        if not comparable(c["resource_version"]):
            continue
        print_ = fingerprint(c["group"], c["kind"], c["namespace"], c["name"])[:6]
        version = int(c["resource_version"])
        recorded[print_] = max(recorded.get(print_, 0), version)
    memo += b"".join(p + varint(v) for p, v in recorded.items())
    return {"name": name, "desired": desired, "children": children, "memo_hex": memo.hex()}


def child(group, kind, name, resource_version, namespace="ns"):
    return {"group": group, "kind": kind, "namespace": namespace, "name": name,
            "resource_version": resource_version}


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
    case("a child keeps its newest version, in the place first recorded", "generation-3", [
        child("apps", "Deployment", "web", "78"),
        child("", "ConfigMap", "web", "5"),
        child("apps", "Deployment", "web", "77"),
        child("apps", "Deployment", "web", "300"),
    ]),
    case("a version that is not comparable is not recorded", "generation-3", [
        child("", "ConfigMap", "a", "0"),
        child("", "ConfigMap", "b", "012"),
        child("", "ConfigMap", "c", "opaque"),
        child("", "ConfigMap", "d", "1234567890123"),
        child("", "ConfigMap", "e", "18446744073709551616"),
        child("", "ConfigMap", "f", "18446744073709551615"),
    ]),
    case("one name in two namespaces is two children", "generation-3", [
        child("", "ConfigMap", "settings", "40", namespace="team-a"),
        child("", "ConfigMap", "settings", "41", namespace="team-b"),
    ]),
    case("a cluster-scoped child", "1", [
        child("rbac.authorization.k8s.io", "ClusterRole", "reader", "9", namespace=""),
    ]),
]

if __name__ == "__main__":
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "checked_vectors.json"), "w") as f:
        json.dump({"cases": CASES}, f, indent=2)
        f.write("\n")
