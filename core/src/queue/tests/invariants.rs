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
    /// A take whose caller says the keys of one namespace wait (owners whose children are
    /// being listed): they stay ready, the others are handed out.
    TakeWaiting(u8, u8),
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
        1 => (0u8..4, 0u8..3).prop_map(|(s, n)| Op::TakeWaiting(s, n)),
        1 => (0u8..3, any::<bool>()).prop_map(|(n, d)| Op::Forget(n, d)),
    ]
}

/// Key `k` of the property test: three namespaces, so prefixes come and go with their keys.
fn prop_key(k: u8) -> String {
    format!("/ConfigMap/ns-{}/k{k}", k % 3)
}

/// The queue under random operations, with what the test expects of it.
struct World {
    now: Instant,
    q: GroupQueue,
    /// Deliveries handed out and not yet acknowledged, per session.
    outstanding: HashMap<u64, Vec<DeliveryId>>,
    /// Keys changed since their last delivery started.
    owed: HashSet<String>,
    /// The session of each replica slot: a reconnect gives it a new one.
    ids: [u64; 4],
}

impl World {
    /// A world whose queue keeps delivered bodies if `keep`.
    fn new(keep: bool) -> Self {
        Self {
            now: Instant::now(),
            q: GroupQueue::new(QueueConfig {
                keep_delivered_bodies: keep,
                ..queue().config
            }),
            outstanding: HashMap::default(),
            owed: HashSet::new(),
            ids: [0, 1, 2, 3],
        }
    }

    /// Applies `op`; the invariants hold after it.
    fn apply(&mut self, op: Op) {
        match op {
            Op::Change(k, deleted) => {
                let reason = if deleted {
                    Reason::Deleted
                } else {
                    Reason::Modified
                };
                self.q.change(&prop_key(k), with_body(reason, 1, 20));
                // A key the ring moved away is its new owner's to reconcile.
                if !self.q.is_leaving(&prop_key(k)) {
                    self.owed.insert(prop_key(k));
                }
            }
            Op::AddSession(s) => {
                self.q
                    .add_session(self.ids[usize::from(s)], &format!("replica-{s}"));
            }
            Op::RemoveSession(s) => {
                self.q.remove_session(self.ids[usize::from(s)]);
                self.outstanding.remove(&self.ids[usize::from(s)]);
            }
            Op::CloseSession(s, ms) => {
                self.q.remove_session_holding(
                    self.ids[usize::from(s)],
                    self.now + Duration::from_millis(u64::from(ms)),
                );
                self.outstanding.remove(&self.ids[usize::from(s)]);
            }
            Op::Reconnect(s, ms) => self.reconnect(s, ms),
            Op::Take(s, n) => {
                let got = self
                    .q
                    .take(self.ids[usize::from(s)], usize::from(n), self.now);
                self.handed(s, &got);
            }
            Op::Ack(s, o) => self.ack(s, o),
            Op::Advance(ms) => {
                self.now += Duration::from_millis(u64::from(ms));
                self.q.advance(self.now);
            }
            Op::Resync(k) => {
                self.q.resync(&prop_key(k));
            }
            Op::Promote(k) => {
                self.q.promote([prop_key(k).as_str()]);
            }
            Op::Listed(k) => {
                self.q.change_in(
                    &prop_key(k),
                    with_body(Reason::Modified, 2, 20),
                    Lane::Listed,
                );
                if !self.q.is_leaving(&prop_key(k)) {
                    self.owed.insert(prop_key(k));
                }
            }
            Op::TakeSmall(s) => {
                let got = self
                    .q
                    .take_within(self.ids[usize::from(s)], 3, 300, self.now);
                self.handed(s, &got);
            }
            Op::TakeWaiting(s, n) => self.take_waiting(s, n),
            Op::Forget(n, drain) => {
                let moved = format!("/ns-{n}/");
                self.q.forget_where(|key| key.contains(&moved), drain);
                // Their new owner reconciles them; here they may still be delivered.
                self.owed.retain(|key| !key.contains(&moved));
            }
        }
        self.q.check();
    }

    /// `got` was handed to the session of slot `s`.
    fn handed(&mut self, s: u8, got: &[Delivery]) {
        for d in got {
            self.owed.remove(&*d.key);
            self.outstanding
                .entry(self.ids[usize::from(s)])
                .or_default()
                .push(d.id);
        }
    }

    /// The session of slot `s` takes, its caller saying the keys of namespace `n` wait: none
    /// of them is handed out but deletions and keys on their way to another dispatcher.
    fn take_waiting(&mut self, s: u8, n: u8) {
        let waits = format!("/ns-{n}/");
        let got = self.q.take_within_sized(
            self.ids[usize::from(s)],
            4,
            usize::MAX,
            self.now,
            |key, may| (!(may.is_some() && key.contains(&waits))).then_some(0),
        );
        for d in &got {
            assert!(
                d.deleted || !d.key.contains(&waits) || self.q.is_leaving(&d.key),
                "{} was handed out while it waits",
                d.key
            );
        }
        self.handed(s, &got);
    }

    /// The replica of slot `s` opens a new session, which replaces its old one (whose keys in
    /// flight are held for `ms`).
    fn reconnect(&mut self, s: u8, ms: u16) {
        let old = self.ids[usize::from(s)];
        let older = if self.q.has_session(old) {
            vec![(old, self.now + Duration::from_millis(u64::from(ms)))]
        } else {
            Vec::new()
        };
        // Ids stay apart per replica: the slot's id plus 4 each time.
        self.ids[usize::from(s)] += 4;
        self.q
            .add_session_replacing(self.ids[usize::from(s)], &format!("replica-{s}"), &older);
        self.outstanding.remove(&old);
    }

    /// Session `s` acknowledges its last delivery: a success (`o` 0), a failure (1) or a
    /// requeue (else).
    fn ack(&mut self, s: u8, o: u8) {
        if let Some(id) = self
            .outstanding
            .get_mut(&self.ids[usize::from(s)])
            .and_then(|v| v.pop())
        {
            let outcome = match o {
                0 => Outcome::Success,
                1 => Outcome::Failure,
                _ => Outcome::Requeue(Duration::from_millis(50)),
            };
            self.q.ack(self.ids[usize::from(s)], id, outcome, self.now);
        }
    }

    /// Works the queue dry with one session: failures and requeues are retried, then done.
    fn drain(&mut self) {
        self.q.add_session(99, "drain");
        for id in self.ids {
            self.q.remove_session(id);
        }
        for _ in 0..1000 {
            self.now += Duration::from_secs(2);
            self.q.advance(self.now);
            let batch = self.q.take(99, 100, self.now);
            for d in &batch {
                self.owed.remove(&*d.key);
                self.q.ack(99, d.id, Outcome::Success, self.now);
            }
            self.q.check();
            if batch.is_empty() && self.q.next_deadline().is_none() {
                break;
            }
        }
    }
}

proptest! {
    /// Whatever happens, the invariants hold, and once every session works the queue dry,
    /// every key changed after its last delivery began has been delivered again: nothing lost.
    /// A queue that keeps delivered bodies ends with at most half its budget of them.
    #[test]
    fn nothing_is_lost_and_invariants_hold(
        ops in prop::collection::vec(op(), 1..200),
        keep in any::<bool>(),
    ) {
        let mut world = World::new(keep);
        for op in ops {
            world.apply(op);
        }
        world.drain();
        prop_assert!(world.owed.is_empty(), "changes never delivered: {:?}", world.owed);
        prop_assert_eq!(world.q.ready_len(), 0);
        if keep {
            prop_assert!(world.q.body_bytes() <= world.q.config.body_budget / 2);
        } else {
            prop_assert_eq!(world.q.body_bytes(), 0);
        }
    }
}
