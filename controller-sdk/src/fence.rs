//! Fencing: the deadlines a replica keeps for one session, on its own clock, so that it stops
//! every reconcile of the session before the dispatcher could hand the key to another replica
//! (`CONTRACT.md`, section 3.3).
//!
//! The dispatcher counts a session's ttl from each renewal and a delivery's maximum reconcile
//! time from the moment it hands the key out, on its clock. The replica cannot read that clock,
//! but it knows when it *sent* each call, and the dispatcher can only act on a call after
//! receiving it. So every deadline here counts from the send, plus the time the dispatcher
//! reports it held a long poll before answering (`PollResponse.held`): never later than the
//! dispatcher's own start, whatever the call's latency or the poll's wait. Counting from when
//! the answer *arrived* instead would run late by the answer's transit time, and counting a
//! renewal from after a wait that followed it (a saturated replica waiting for a free slot)
//! would run late by that wait.
//!
//! Margins, for a session of ttl `t` and a maximum reconcile time `m`:
//!
//! - the session counts as lost at `3/4 t` after the latest renewal: the dispatcher expires it
//!   at `t` at the earliest, so `t/4` covers a difference in clock rates of up to a third and
//!   the time a cancelled reconcile takes to stop;
//! - a reconcile is cancelled at `9/10 m` after its delivery: the dispatcher voids the delivery
//!   at `m` at the earliest.

use std::time::Duration;

use tokio::time::Instant;

/// Longest a poll asks to wait; well under any sane ttl.
const POLL_WAIT: Duration = Duration::from_secs(5);

/// The deadlines of one session.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Fence {
    ttl: Duration,
    max_reconcile: Duration,
    /// The latest instant at which the dispatcher renewed the session, or later.
    renewed: Instant,
}

impl Fence {
    /// A session opened by a call sent at `sent`, with the ttl and maximum reconcile time the
    /// dispatcher granted.
    pub(crate) fn new(ttl: Duration, max_reconcile: Duration, sent: Instant) -> Self {
        Self {
            ttl,
            max_reconcile,
            renewed: sent,
        }
    }

    /// The session counts as lost from this instant on, unless renewed before.
    pub(crate) fn lost_at(&self) -> Instant {
        self.renewed + self.ttl * 3 / 4
    }

    /// A call sent at `sent` was answered after the dispatcher held it for `held` (zero for a
    /// call it answers at once): the session was renewed at that point or later. Returns that
    /// point, from which the requests the call delivered count their deadlines.
    pub(crate) fn renewed(&mut self, sent: Instant, held: Duration) -> Instant {
        let at = sent + held;
        self.renewed = self.renewed.max(at);
        at
    }

    /// How long a delivery may take, counted from when it was delivered (see
    /// [`Fence::renewed`]).
    pub(crate) fn reconcile_limit(&self) -> Duration {
        self.max_reconcile - self.max_reconcile / 10
    }

    /// The instant by which a reconcile delivered at `delivered` must have ended.
    pub(crate) fn reconcile_deadline(&self, delivered: Instant) -> Instant {
        delivered + self.reconcile_limit()
    }

    /// How often an idle or draining session renews, and the longest a poll asks to wait: a
    /// quarter of the ttl at most, so that a full wait and the next call fit well within the
    /// fence.
    pub(crate) fn poll_wait(&self) -> Duration {
        POLL_WAIT.min(self.ttl / 4)
    }

    /// How long the next call may wait (a long poll held by the dispatcher, or a saturated
    /// replica waiting for a free slot) at `now`, when the last call took `round_trip`: at most
    /// [`Fence::poll_wait`], and short enough that the call after the wait is answered before
    /// the fence, with room to spare. At least a millisecond (a poll's wait must be positive).
    pub(crate) fn wait_at(&self, now: Instant, round_trip: Duration) -> Duration {
        let spare = self
            .lost_at()
            .saturating_duration_since(now)
            .saturating_sub(round_trip);
        self.poll_wait()
            .min(spare / 2)
            .max(Duration::from_millis(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(4);
    const MAX: Duration = Duration::from_secs(10);

    /// The dispatcher's view of one session: it renews when it answers, and expires the session
    /// a ttl later.
    struct Dispatcher {
        expires: Instant,
    }

    /// A long poll sent at `sent`, in transit `latency` each way, held `held` by the
    /// dispatcher: the replica's fence is never past the dispatcher's expiry, and a delivery's
    /// deadline never past the dispatcher's.
    #[tokio::test(start_paused = true)]
    async fn deadlines_end_before_the_dispatchers_whatever_the_latency_and_wait() {
        for latency_ms in [0u64, 1, 300, 900] {
            for held_ms in [0u64, 250, 1000] {
                let latency = Duration::from_millis(latency_ms);
                let held = Duration::from_millis(held_ms);
                let sent = Instant::now();
                let mut fence = Fence::new(TTL, MAX, sent);
                // The dispatcher receives the poll, holds it, hands keys out and renews.
                let answered = sent + latency + held;
                let dispatcher = Dispatcher {
                    expires: answered + TTL,
                };
                let delivered_at_dispatcher = answered;
                // The answer reaches the replica `latency` later.
                let delivered = fence.renewed(sent, held);
                assert!(fence.lost_at() + TTL / 4 <= dispatcher.expires);
                assert!(
                    fence.reconcile_deadline(delivered) + MAX / 10 <= delivered_at_dispatcher + MAX
                );
            }
        }
    }

    /// A saturated replica renews with an empty ack and then waits for a free slot: the wait
    /// does not move its fence, which counts from the ack's send.
    #[tokio::test(start_paused = true)]
    async fn a_wait_after_a_renewal_does_not_move_the_fence() {
        let sent = Instant::now();
        let mut fence = Fence::new(TTL, MAX, sent);
        let renewed_at = fence.renewed(sent, Duration::ZERO);
        tokio::time::sleep(fence.poll_wait()).await;
        assert_eq!(fence.lost_at(), renewed_at + TTL * 3 / 4);
        // An older answer arriving late never moves it back.
        fence.renewed(sent - Duration::from_secs(1), Duration::ZERO);
        assert_eq!(fence.lost_at(), renewed_at + TTL * 3 / 4);
    }

    /// The cases every controller SDK is checked against (`proto/testdata/fence_vectors.json`,
    /// made by its `gen_fence_vectors.py`): the same deadlines in every language.
    #[tokio::test(start_paused = true)]
    async fn the_shared_vectors_hold() {
        let vectors: serde_json::Value =
            serde_json::from_str(include_str!("../../proto/testdata/fence_vectors.json"))
                .expect("the vectors are JSON");
        let cases = vectors["cases"].as_array().expect("cases");
        assert!(cases.len() >= 8);
        let ns = |v: &serde_json::Value| Duration::from_nanos(v.as_u64().expect("nanoseconds"));
        for case in cases {
            let name = case["name"].as_str().unwrap_or_default();
            let zero = Instant::now();
            let mut fence = Fence::new(ns(&case["ttl_ns"]), ns(&case["max_reconcile_ns"]), zero);
            let mut delivered = zero;
            for renewal in case["renewals"].as_array().expect("renewals") {
                delivered = fence.renewed(zero + ns(&renewal["sent_ns"]), ns(&renewal["held_ns"]));
            }
            let expect = &case["expect"];
            assert_eq!(fence.lost_at(), zero + ns(&expect["lost_at_ns"]), "{name}");
            assert_eq!(
                fence.reconcile_limit(),
                ns(&expect["reconcile_limit_ns"]),
                "{name}"
            );
            assert_eq!(delivered, zero + ns(&expect["last_delivered_ns"]), "{name}");
            assert_eq!(
                fence.reconcile_deadline(delivered),
                zero + ns(&expect["reconcile_deadline_ns"]),
                "{name}"
            );
            assert_eq!(fence.poll_wait(), ns(&expect["poll_wait_ns"]), "{name}");
            assert_eq!(
                fence.wait_at(zero + ns(&case["now_ns"]), ns(&case["round_trip_ns"])),
                ns(&expect["wait_ns"]),
                "{name}"
            );
        }
    }

    /// Polls held as long as asked keep the session while a round trip takes less than
    /// three eighths of the ttl: each wait leaves room for the next answer before the fence.
    #[tokio::test(start_paused = true)]
    async fn polls_held_as_long_as_asked_keep_the_session() {
        for round_trip_ms in [0u64, 100, 800, 1400] {
            let round_trip = Duration::from_millis(round_trip_ms);
            let mut fence = Fence::new(TTL, MAX, Instant::now());
            let mut last = round_trip;
            for _ in 0..50 {
                let wait = fence.wait_at(Instant::now(), last);
                let sent = Instant::now();
                tokio::time::sleep(wait + round_trip).await;
                assert!(
                    Instant::now() < fence.lost_at(),
                    "answered before the fence"
                );
                fence.renewed(sent, wait);
                last = round_trip + wait;
            }
        }
    }
}
