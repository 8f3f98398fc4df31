"""What `make demo` and `make e2e` read off the example controller: the content hash it writes,
and its reconciles, from the JSON log lines the SDK writes when a reconcile span opens and
closes (KD_LOG_JSON=1)."""

import hashlib
import json
from collections import defaultdict
from datetime import datetime

ANNOTATION = "example.kube-dispatch.dev/content-hash"


def content_hash(data):
    """The annotation configmap_hasher writes for a ConfigMap's data."""
    h = hashlib.sha256()
    for k in sorted(data):
        h.update(k.encode() + b"\0" + data[k].encode() + b"\0")
    return h.hexdigest()


def annotated(configmap):
    """Whether a ConfigMap carries the hash of its current content."""
    annotations = configmap["metadata"].get("annotations") or {}
    return annotations.get(ANNOTATION) == content_hash(configmap.get("data") or {})


def spans(lines, cut_at=None):
    """The reconcile spans in one replica's log lines: (key, dispatcher, start, end), times in
    seconds since the epoch. A span still open at the end of the log ends at `cut_at` (the
    replica was killed then), or None (still running)."""
    runs, open_spans = [], {}
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        span = event.get("span") or {}
        if span.get("name") != "reconcile":
            continue
        message = event.get("fields", {}).get("message")
        at = datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00")).timestamp()
        key = span.get("key")
        if message == "new":
            open_spans[key] = (span.get("dispatcher", "?"), at)
        elif message == "close" and key in open_spans:
            dispatcher, begun = open_spans.pop(key)
            runs.append((key, dispatcher, begun, at))
    for key, (dispatcher, begun) in open_spans.items():
        runs.append((key, dispatcher, begun, cut_at))
    return runs


def concurrent(runs):
    """Pairs of reconciles of one key that overlapped in time on different replicas, from
    (replica, key, start, end) tuples (end None: still running)."""
    by_key = defaultdict(list)
    for replica, key, begun, end in runs:
        by_key[key].append((begun, end if end is not None else float("inf"), replica))
    pairs = 0
    for found in by_key.values():
        found.sort()
        for a, b in zip(found, found[1:]):
            if a[1] > b[0] and a[2] != b[2]:
                pairs += 1
    return pairs


# The Go SDK's example controller (controller-sdk/go/examples/configmap-hasher) beside it: its
# annotation and hash, and its reconciles from the log lines the SDK writes at debug level
# (controller-runtime's JSON logger, --zap-log-level=2 --zap-time-encoding=epoch; level 2, as at
# debug level controller-runtime drops lines of one message past 100 a second):
# "reconcile started" and "reconcile ended", paired by controller-runtime's reconcileID.
GO_ANNOTATION = "example.kube-dispatch.dev/hash"


def go_content_hash(data):
    """The annotation the Go example writes: the first 16 hex digits of the SHA-256 of the
    data's "key=value" lines, in key order."""
    h = hashlib.sha256()
    for k in sorted(data):
        h.update(f"{k}={data[k]}\n".encode())
    return h.hexdigest()[:16]


def go_annotated(configmap):
    """Whether a ConfigMap carries the Go example's hash of its current content."""
    annotations = configmap["metadata"].get("annotations") or {}
    return annotations.get(GO_ANNOTATION) == go_content_hash(configmap.get("data") or {})


def go_spans(lines, cut_at=None):
    """The Go example's reconciles in one replica's log lines, as `spans` gives them."""
    runs, open_spans = [], {}
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        message, reconcile_id = event.get("msg"), event.get("reconcileID")
        if message not in ("reconcile started", "reconcile ended") or not reconcile_id:
            continue
        # Seconds since the epoch (--zap-time-encoding=epoch), or an RFC 3339 time.
        ts = event["ts"]
        at = (float(ts) if isinstance(ts, (int, float))
              else datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp())
        if message == "reconcile started":
            open_spans[reconcile_id] = (event.get("key"), event.get("dispatcher", "?"), at)
        elif reconcile_id in open_spans:
            key, dispatcher, begun = open_spans.pop(reconcile_id)
            runs.append((key, dispatcher, begun, at))
    for key, dispatcher, begun in open_spans.values():
        runs.append((key, dispatcher, begun, cut_at))
    return runs
