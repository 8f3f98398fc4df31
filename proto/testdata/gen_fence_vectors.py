#!/usr/bin/env python3
"""Writes fence_vectors.json: the fencing deadlines a controller SDK keeps for one session
(CONTRACT.md section 3.3), as both SDKs must compute them. Every time is in nanoseconds on the
replica's own clock, counted from the send of OpenSession (0). Run: python3 gen_fence_vectors.py

Rules (controller-sdk/src/fence.rs):
- renewed = max(renewed, sent + held) for every answered call; 0 after OpenSession;
- lost_at = renewed + ttl * 3 / 4 (integer nanoseconds, truncated);
- reconcile_limit = max - max / 10; a delivery at sent + held must end by that plus the limit;
- poll_wait = min(5 s, ttl / 4);
- wait_at(now, round_trip) = max(1 ms, min(poll_wait, max(0, lost_at - now - round_trip) / 2)).
"""
import json

MS = 1_000_000
S = 1_000 * MS

def case(name, ttl, max_reconcile, renewals, now, round_trip):
    renewed = 0
    delivered = 0
    for sent, held in renewals:
        delivered = sent + held
        renewed = max(renewed, delivered)
    lost_at = renewed + ttl * 3 // 4
    limit = max_reconcile - max_reconcile // 10
    poll_wait = min(5 * S, ttl // 4)
    spare = max(0, lost_at - now - round_trip)
    wait = max(1 * MS, min(poll_wait, spare // 2))
    return {
        "name": name,
        "ttl_ns": ttl,
        "max_reconcile_ns": max_reconcile,
        "renewals": [{"sent_ns": s, "held_ns": h} for s, h in renewals],
        "now_ns": now,
        "round_trip_ns": round_trip,
        "expect": {
            "lost_at_ns": lost_at,
            "reconcile_limit_ns": limit,
            "last_delivered_ns": delivered,
            "reconcile_deadline_ns": delivered + limit,
            "poll_wait_ns": poll_wait,
            "wait_ns": wait,
        },
    }

cases = [
    case("defaults, just opened", 10 * S, 60 * S, [], 0, 2 * MS),
    case("defaults, a long poll held 2.5 s", 10 * S, 60 * S, [(3 * MS, 2500 * MS)], 2510 * MS, 4 * MS),
    case("a late answer of an older call does not move the fence back", 4 * S, 10 * S,
         [(1000 * MS, 500 * MS), (200 * MS, 0)], 1700 * MS, 10 * MS),
    case("a saturated renewal, then a wait for a slot", 4 * S, 10 * S, [(800 * MS, 0)], 1800 * MS, 1 * MS),
    case("round trip eats the spare: at least a millisecond", 4 * S, 10 * S, [(0, 0)], 2900 * MS, 200 * MS),
    case("past the fence", 4 * S, 10 * S, [(0, 0)], 3500 * MS, 0),
    case("odd nanoseconds truncate alike", 10 * S + 3, 60 * S + 7, [(1, 2)], 5, 7),
    case("ttl above 20 s: the poll wait caps at 5 s", 30 * S, 120 * S, [(0, 5 * S)], 5 * S, 0),
]

with open("fence_vectors.json", "w") as f:
    json.dump({"cases": cases}, f, indent=1)
    f.write("\n")
