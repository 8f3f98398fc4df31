//! Acknowledgements from the network, checked before the queue acts on them: every outcome is
//! set, every duration positive and within what a timer can hold. A request that breaks one of
//! these is refused whole, with a message that says what to fix (INVALID_ARGUMENT at the gRPC
//! edge); nothing a client sends can overflow a timer or panic a task.

use std::time::Duration;

use kube_dispatch_proto::{
    MAX_MEMO_BYTES,
    v1::{AckItem, ack_item},
};

use crate::{
    queue::{DeliveryId, Outcome},
    subscription::{InvalidRequest, positive_duration},
};

/// Longest delay a reconcile may ask for before its key is delivered again (`requeue.after`):
/// a week. A controller that wants to hear of a key only when it changes acknowledges success;
/// the periodic resync still comes in between.
pub const MAX_REQUEUE_AFTER: Duration = Duration::from_secs(7 * 24 * 3600);

/// The outcome one acknowledgement reports.
pub fn ack_outcome(ack: &AckItem) -> Result<Outcome, InvalidRequest> {
    match &ack.outcome {
        None => Err(InvalidRequest::NoOutcome(ack.delivery_id)),
        Some(ack_item::Outcome::Success(_)) => Ok(Outcome::Success),
        Some(ack_item::Outcome::Failure(_)) => Ok(Outcome::Failure),
        Some(ack_item::Outcome::Requeue(r)) => {
            let after = r
                .after
                .as_ref()
                .ok_or(InvalidRequest::Empty("requeue.after"))?;
            let after = positive_duration("requeue.after", after)?;
            if after > MAX_REQUEUE_AFTER {
                return Err(InvalidRequest::DurationTooLong {
                    name: "requeue.after",
                    max: MAX_REQUEUE_AFTER,
                });
            }
            Ok(Outcome::Requeue(after))
        }
    }
}

/// One acknowledgement, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Acked {
    /// The delivery it settles.
    pub delivery: DeliveryId,
    /// What the reconcile did.
    pub outcome: Outcome,
    /// The memo it leaves for the key's next delivery (empty: none), at most
    /// [`kube_dispatch_proto::MAX_MEMO_BYTES`].
    pub memo: Vec<u8>,
}

impl From<(DeliveryId, Outcome)> for Acked {
    fn from((delivery, outcome): (DeliveryId, Outcome)) -> Self {
        Self {
            delivery,
            outcome,
            memo: Vec::new(),
        }
    }
}

/// A request's acknowledgements, at most `max` of them.
pub fn ack_outcomes(acks: &[AckItem], max: usize) -> Result<Vec<Acked>, InvalidRequest> {
    if acks.len() > max {
        return Err(InvalidRequest::TooManyAcks {
            got: acks.len(),
            max,
        });
    }
    acks.iter()
        .map(|a| {
            if a.memo.len() > MAX_MEMO_BYTES {
                return Err(InvalidRequest::MemoTooLong {
                    delivery: a.delivery_id,
                    got: a.memo.len(),
                    max: MAX_MEMO_BYTES,
                });
            }
            Ok(Acked {
                delivery: a.delivery_id,
                outcome: ack_outcome(a)?,
                memo: a.memo.clone(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::{collections::HashSet, sync::Arc, time::Instant};

    use kube_dispatch_proto::v1::{AckItem, Failure, Requeue, Success, ack_item};
    use proptest::prelude::*;

    use super::*;
    use crate::queue::{Change, GroupQueue, QueueConfig, later};

    fn requeue(seconds: i64, nanos: i32) -> AckItem {
        AckItem {
            delivery_id: 1,
            outcome: Some(ack_item::Outcome::Requeue(Requeue {
                after: Some(prost_types::Duration { seconds, nanos }),
            })),
            memo: Vec::new(),
        }
    }

    #[test]
    fn absurd_requeues_are_refused_with_the_bound() {
        let e = ack_outcome(&requeue(i64::MAX, 0)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "requeue.after must be at most 604800s (a week); acknowledge success to wait for the next change"
        );
        assert!(matches!(
            ack_outcome(&requeue(0, 0)),
            Err(InvalidRequest::Duration("requeue.after"))
        ));
        assert!(matches!(
            ack_outcome(&requeue(-1, 0)),
            Err(InvalidRequest::Duration("requeue.after"))
        ));
        assert_eq!(
            ack_outcome(&requeue(604_800, 0)),
            Ok(Outcome::Requeue(MAX_REQUEUE_AFTER))
        );
        let none = AckItem {
            delivery_id: 7,
            outcome: None,
            memo: Vec::new(),
        };
        assert!(ack_outcome(&none).unwrap_err().to_string().contains('7'));
        assert!(matches!(
            ack_outcomes(&[requeue(1, 0), requeue(1, 0)], 1),
            Err(InvalidRequest::TooManyAcks { got: 2, max: 1 })
        ));
        let long = AckItem {
            memo: vec![b'x'; MAX_MEMO_BYTES + 1],
            ..requeue(1, 0)
        };
        assert_eq!(
            ack_outcomes(&[long], 1).unwrap_err().to_string(),
            "the memo of delivery 1 is 513 bytes; at most 512 are accepted (keep versions and hashes in it, not objects)"
        );
    }

    fn any_ack() -> impl Strategy<Value = AckItem> {
        let outcome = prop_oneof![
            Just(None),
            Just(Some(ack_item::Outcome::Success(Success {}))),
            ".{0,20}".prop_map(|message| Some(ack_item::Outcome::Failure(Failure { message }))),
            proptest::option::of(
                (any::<i64>(), any::<i32>())
                    .prop_map(|(seconds, nanos)| prost_types::Duration { seconds, nanos })
            )
            .prop_map(|after| Some(ack_item::Outcome::Requeue(Requeue { after }))),
        ];
        let memo = prop_oneof![
            Just(Vec::new()),
            proptest::collection::vec(any::<u8>(), 1..=MAX_MEMO_BYTES),
            proptest::collection::vec(any::<u8>(), MAX_MEMO_BYTES + 1..MAX_MEMO_BYTES + 8),
        ];
        (0u64..8, outcome, memo).prop_map(|(delivery_id, outcome, memo)| AckItem {
            delivery_id,
            outcome,
            memo,
        })
    }

    proptest! {
        /// Any acknowledgements a client can send: either refused whole, or applied to a queue
        /// with keys in flight without a panic; once every delay has passed, the keys not
        /// acknowledged as done are handed out again.
        #[test]
        fn any_acks_are_refused_or_applied(acks in proptest::collection::vec(any_ack(), 0..12)) {
            let mut queue = GroupQueue::new(QueueConfig::default());
            let now = Instant::now();
            queue.add_session(1, "replica");
            for i in 0..8 {
                let change = Change {
                    body: Some(Arc::from(&b"{}"[..])),
                    ..Change::related(kube_dispatch_proto::v1::Reason::Owned)
                };
                queue.change(&format!("/ConfigMap/ns/cm-{i}"), change);
            }
            let taken = queue.take(1, 8, now);
            prop_assert_eq!(taken.len(), 8);
            let Ok(outcomes) = ack_outcomes(&acks, 10) else { return Ok(()) };
            let (mut done, mut settled) = (HashSet::new(), HashSet::new());
            for Acked { delivery: index, outcome, memo } in outcomes {
                let id = taken[usize::try_from(index).unwrap_or(0)].id;
                if settled.insert(id) && outcome == Outcome::Success {
                    done.insert(id);
                }
                queue.leave_memo(1, id, &memo);
                queue.ack(1, id, outcome, now);
            }
            // Past every requeue, then past the backoff of deliveries that expired in flight.
            let far = later(now, MAX_REQUEUE_AFTER + Duration::from_secs(1));
            queue.advance(far);
            let farther = later(far, Duration::from_secs(2000));
            queue.advance(farther);
            prop_assert_eq!(queue.take(1, 8, farther).len(), 8 - done.len());
        }
    }
}
