#!/usr/bin/env python3
"""Compares two YAML streams of Kubernetes objects (what `helm template` renders and what
`kubectl kustomize` builds): the same objects, by kind, namespace and name, with the same
content, Helm's own labels aside (app.kubernetes.io/managed-by, instance, version and
helm.sh/chart) and without the Namespace object (Helm's --create-namespace makes it).
Exits non-zero with the differences.

    python3 tests/same-objects.py CHART.yaml KUSTOMIZE.yaml
"""
import json
import sys

import yaml

HELM_LABELS = {"app.kubernetes.io/managed-by", "app.kubernetes.io/instance",
               "app.kubernetes.io/version", "helm.sh/chart"}


def objects(path):
    found = {}
    with open(path) as f:
        for o in yaml.safe_load_all(f):
            if not o or o.get("kind") == "Namespace":
                continue
            labels = o.get("metadata", {}).get("labels")
            if labels is not None:
                for label in HELM_LABELS:
                    labels.pop(label, None)
                if not labels:
                    del o["metadata"]["labels"]
            meta = o["metadata"]
            found[(o["kind"], meta.get("namespace", ""), meta["name"])] = o
    return found


def main():
    chart, base = objects(sys.argv[1]), objects(sys.argv[2])
    problems = []
    for key in sorted(set(chart) | set(base)):
        if key not in chart:
            problems.append(f"{key}: only in {sys.argv[2]}")
        elif key not in base:
            problems.append(f"{key}: only in {sys.argv[1]}")
        elif chart[key] != base[key]:
            a = json.dumps(chart[key], indent=1, sort_keys=True).splitlines()
            b = json.dumps(base[key], indent=1, sort_keys=True).splitlines()
            import difflib
            diff = "\n".join(difflib.unified_diff(b, a, "kustomize", "helm", lineterm="", n=2))
            problems.append(f"{key} differs:\n{diff}")
    if problems:
        sys.exit("same-objects: the chart and the Kustomize build differ:\n" + "\n".join(problems))
    print(f"same-objects: {len(chart)} objects, the same")


if __name__ == "__main__":
    main()
