//! The work queue of a controller group, driven by arbitrary sequences of operations (sessions
//! coming and going, changes, observations of the stream and of lists, in their two lanes,
//! sweeps, takes, acks with every outcome, timers, keys moving away): it must never panic and
//! never hand a key to a session while the key is in flight.

#![no_main]

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use kube_dispatch_core::{
    backoff::Backoff,
    queue::{Change, GroupQueue, Lane, Observed, Outcome, QueueConfig},
};
use kube_dispatch_proto::v1::Reason;
use libfuzzer_sys::{
    arbitrary::{self, Arbitrary},
    fuzz_target,
};

#[derive(Arbitrary, Debug)]
enum Op {
    AddSession(u8),
    RemoveSession(u8),
    Change(u8, u8, bool),
    /// An object seen by the stream, or (`true`) by a list: the listed lane; with a change
    /// filter's hash (0: no filter), of few values so that equal ones are common.
    Observe(u8, u8, u8, bool, u8),
    Sweep(u8),
    Take(u8, u8),
    Ack(u8, u8),
    Advance(u16),
    Resync(u8),
    Move(u8, bool),
}

fuzz_target!(|ops: Vec<Op>| {
    let mut q = GroupQueue::new(QueueConfig {
        backoff: Backoff {
            base: Duration::from_millis(5),
            cap: Duration::from_secs(10),
        },
        max_reconcile_time: Duration::from_secs(30),
        body_budget: 64,
        memo_budget: 64,
    });
    let mut now = Instant::now();
    // Delivery id to (session, key, deadline), for deliveries not yet settled.
    let mut in_flight: HashMap<u64, (u64, String, Instant)> = HashMap::new();
    // Live sessions (id, replica); ids are never reused, as on the server.
    let mut sessions: Vec<(u64, u8)> = Vec::new();
    let mut next_session = 1u64;
    for op in ops {
        match op {
            Op::AddSession(r) => {
                let replica = r % 4;
                // A replica's new session replaces its old one, releasing its keys.
                if let Some(pos) = sessions.iter().position(|(_, rr)| *rr == replica) {
                    let (old, _) = sessions.remove(pos);
                    in_flight.retain(|_, (session, _, _)| *session != old);
                }
                q.add_session(next_session, &format!("replica-{replica}"));
                sessions.push((next_session, replica));
                next_session += 1;
            }
            Op::RemoveSession(i) => {
                if sessions.is_empty() {
                    continue;
                }
                let (id, _) = sessions.remove(usize::from(i) % sessions.len());
                q.remove_session(id);
                in_flight.retain(|_, (session, _, _)| *session != id);
            }
            Op::Change(k, rv, deleted) => {
                q.change(
                    &format!("k{}", k % 16),
                    Change {
                        reason: if deleted {
                            Reason::Deleted
                        } else {
                            Reason::Modified
                        },
                        resource_version: rv.to_string(),
                        uid: "u".into(),
                        body: Some(vec![0; usize::from(rv % 40)].into()),
                        deleted,
                        trace: None,
                    },
                );
            }
            Op::Observe(k, rv, epoch, listed, fingerprint) => {
                q.observe_in(
                    &format!("k{}", k % 16),
                    Observed {
                        resource_version: rv.to_string(),
                        uid: "u".into(),
                        body: Some(vec![0; usize::from(rv % 8)].into()),
                        trace: None,
                        fingerprint: std::num::NonZeroU64::new(u64::from(fingerprint % 4)),
                    },
                    u32::from(epoch % 4),
                    if listed { Lane::Listed } else { Lane::Live },
                );
            }
            Op::Sweep(epoch) => {
                q.sweep(u32::from(epoch % 4), |_| true);
            }
            Op::Take(s, n) => {
                if sessions.is_empty() {
                    continue;
                }
                let (session, _) = sessions[usize::from(s) % sessions.len()];
                for d in q.take(session, usize::from(n % 8), now) {
                    let key = d.key.to_string();
                    assert!(
                        !in_flight.values().any(|(_, k, _)| *k == key),
                        "{key} handed out while in flight"
                    );
                    in_flight.insert(d.id, (session, key, now + Duration::from_secs(30)));
                }
            }
            Op::Ack(i, outcome) => {
                let Some(id) = in_flight.keys().copied().nth(usize::from(i)) else {
                    continue;
                };
                let Some((session, _, _)) = in_flight.remove(&id) else {
                    continue;
                };
                let outcome = match outcome % 3 {
                    0 => Outcome::Success,
                    1 => Outcome::Failure,
                    _ => Outcome::Requeue(Duration::from_millis(u64::from(outcome))),
                };
                // A memo of up to 32 bytes, past the group's 64 at times.
                q.leave_memo(session, id, &vec![i; usize::from(i % 33)]);
                q.ack(session, id, outcome, now);
            }
            Op::Advance(ms) => {
                now += Duration::from_millis(u64::from(ms));
                // Deliveries past the maximum reconcile time expire.
                let _ = q.advance(now);
                in_flight.retain(|_, (_, _, deadline)| *deadline > now);
            }
            Op::Resync(n) => {
                q.resync_batch(usize::from(n % 8));
            }
            Op::Move(k, drain) => {
                let moved = format!("k{}", k % 16);
                q.forget_where(|key| key == moved, drain);
            }
        }
    }
});
