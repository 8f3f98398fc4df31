//! Random operations: nothing is lost and the invariants hold after each.

use proptest::prelude::*;

use super::*;

#[derive(Clone, Debug)]
enum Op {
    Change(u8, bool),
    AddSession(u8),
    RemoveSession(u8),
    CloseSession(u8, u16),
    /// The replica of a session opens a new one, which replaces it: the old one's keys in
    /// flight are held for this many ms.
    Reconnect(u8, u16),
    Take(u8, u8),
    Ack(u8, u8),
    Advance(u16),
    Resync(u8),
    Promote(u8),
    /// A change a list shows ([`Lane::Listed`]).
    Listed(u8),
    /// A take whose bytes fit one key with its body at most.
    TakeSmall(u8),
    /// The ring moves the keys of one namespace away (`drain`: ready keys are delivered here
    /// first).
    Forget(u8, bool),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..12, any::<bool>()).prop_map(|(k, d)| Op::Change(k, d)),
        1 => (0u8..4).prop_map(Op::AddSession),
        1 => (0u8..4).prop_map(Op::RemoveSession),
        1 => (0u8..4, 0u16..5_000).prop_map(|(s, ms)| Op::CloseSession(s, ms)),
        1 => (0u8..4, 0u16..5_000).prop_map(|(s, ms)| Op::Reconnect(s, ms)),
        3 => (0u8..4, 1u8..5).prop_map(|(s, n)| Op::Take(s, n)),
        3 => (0u8..4, 0u8..3).prop_map(|(s, o)| Op::Ack(s, o)),
        1 => (0u16..20_000).prop_map(Op::Advance),
        1 => (0u8..12).prop_map(Op::Resync),
        1 => (0u8..12).prop_map(Op::Promote),
        2 => (0u8..12).prop_map(Op::Listed),
        1 => (0u8..4).prop_map(Op::TakeSmall),
        1 => (0u8..3, any::<bool>()).prop_map(|(n, d)| Op::Forget(n, d)),
    ]
}

/// Key `k` of the property test: three namespaces, so prefixes come and go with their keys.
fn prop_key(k: u8) -> String {
    format!("/ConfigMap/ns-{}/k{k}", k % 3)
}

proptest! {
    /// Whatever happens, the invariants hold, and once every session works the queue dry,
    /// every key changed after its last delivery began has been delivered again: nothing lost.
    #[test]
    fn nothing_is_lost_and_invariants_hold(ops in prop::collection::vec(op(), 1..200)) {
        let mut now = Instant::now();
        let mut q = queue();
        let mut outstanding: HashMap<u64, Vec<DeliveryId>> = HashMap::default();
        // Keys changed since their last delivery started.
        let mut owed: HashSet<String> = HashSet::new();
        // The session of each replica slot: a reconnect gives it a new one.
        let mut ids: [u64; 4] = [0, 1, 2, 3];
        for op in ops {
            match op {
                Op::Change(k, deleted) => {
                    let reason = if deleted { Reason::Deleted } else { Reason::Modified };
                    q.change(&prop_key(k), with_body(reason, 1, 20));
                    // A key the ring moved away is its new owner's to reconcile.
                    if !q.is_leaving(&prop_key(k)) {
                        owed.insert(prop_key(k));
                    }
                }
                Op::AddSession(s) => {
                    q.add_session(ids[usize::from(s)], &format!("replica-{s}"));
                }
                Op::RemoveSession(s) => {
                    q.remove_session(ids[usize::from(s)]);
                    outstanding.remove(&ids[usize::from(s)]);
                }
                Op::CloseSession(s, ms) => {
                    q.remove_session_holding(ids[usize::from(s)], now + Duration::from_millis(u64::from(ms)));
                    outstanding.remove(&ids[usize::from(s)]);
                }
                Op::Reconnect(s, ms) => {
                    let old = ids[usize::from(s)];
                    let older = if q.has_session(old) {
                        vec![(old, now + Duration::from_millis(u64::from(ms)))]
                    } else {
                        Vec::new()
                    };
                    // Ids stay apart per replica: the slot's id plus 4 each time.
                    ids[usize::from(s)] += 4;
                    q.add_session_replacing(ids[usize::from(s)], &format!("replica-{s}"), &older);
                    outstanding.remove(&old);
                }
                Op::Take(s, n) => {
                    for d in q.take(ids[usize::from(s)], usize::from(n), now) {
                        owed.remove(&*d.key);
                        outstanding.entry(ids[usize::from(s)]).or_default().push(d.id);
                    }
                }
                Op::Ack(s, o) => {
                    if let Some(id) = outstanding.get_mut(&ids[usize::from(s)]).and_then(|v| v.pop()) {
                        let outcome = match o {
                            0 => Outcome::Success,
                            1 => Outcome::Failure,
                            _ => Outcome::Requeue(Duration::from_millis(50)),
                        };
                        q.ack(ids[usize::from(s)], id, outcome, now);
                    }
                }
                Op::Advance(ms) => {
                    now += Duration::from_millis(u64::from(ms));
                    q.advance(now);
                }
                Op::Resync(k) => {
                    q.resync(&prop_key(k));
                }
                Op::Promote(k) => {
                    q.promote([prop_key(k).as_str()]);
                }
                Op::Listed(k) => {
                    q.change_in(&prop_key(k), with_body(Reason::Modified, 2, 20), Lane::Listed);
                    if !q.is_leaving(&prop_key(k)) {
                        owed.insert(prop_key(k));
                    }
                }
                Op::TakeSmall(s) => {
                    for d in q.take_within(ids[usize::from(s)], 3, 300, now) {
                        owed.remove(&*d.key);
                        outstanding.entry(ids[usize::from(s)]).or_default().push(d.id);
                    }
                }
                Op::Forget(n, drain) => {
                    let moved = format!("/ns-{n}/");
                    q.forget_where(|key| key.contains(&moved), drain);
                    // Their new owner reconciles them; here they may still be delivered.
                    owed.retain(|key| !key.contains(&moved));
                }
            }
            q.check();
        }
        // Work the queue dry with one session; failures and requeues are retried, then done.
        q.add_session(99, "drain");
        for id in ids {
            q.remove_session(id);
        }
        for _ in 0..1000 {
            now += Duration::from_secs(2);
            q.advance(now);
            let batch = q.take(99, 100, now);
            for d in &batch {
                owed.remove(&*d.key);
                q.ack(99, d.id, Outcome::Success, now);
            }
            q.check();
            if batch.is_empty() && q.next_deadline().is_none() {
                break;
            }
        }
        prop_assert!(owed.is_empty(), "changes never delivered: {:?}", owed);
        prop_assert_eq!(q.ready_len(), 0);
        prop_assert_eq!(q.body_bytes(), 0);
    }
}
