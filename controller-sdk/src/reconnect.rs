//! How a replica paces its reconnects, to a dispatcher or to the load balancer.

use std::time::Duration;

use backon::{BackoffBuilder, ConstantBuilder, ExponentialBuilder};

/// The longest pause between two attempts, jitter included.
const LONGEST: Duration = Duration::from_secs(60);

/// Delays between one loop's reconnect attempts: 100 ms doubling to 30 s while attempts fail,
/// each with a random jitter of up to as much again (so at most 60 s), starting again from
/// 100 ms after an attempt that worked (a session opened, an assignment received). Without the
/// fresh start, a long-lived replica would follow its tenth dispatcher restart only after half a
/// minute.
pub(crate) struct Reconnects {
    delays: Box<dyn Iterator<Item = Duration> + Send>,
}

impl Reconnects {
    pub(crate) fn new() -> Self {
        Self {
            delays: Self::fresh(),
        }
    }

    fn fresh() -> Box<dyn Iterator<Item = Duration> + Send> {
        Box::new(
            ExponentialBuilder::default()
                .with_jitter()
                .with_min_delay(Duration::from_millis(100))
                .with_max_delay(Duration::from_secs(30))
                .without_max_times()
                .build(),
        )
    }

    /// The pause before the next attempt, after one that `worked` or not.
    pub(crate) fn next(&mut self, worked: bool) -> Duration {
        if worked {
            self.delays = Self::fresh();
        }
        self.delays.next().unwrap_or(LONGEST).min(LONGEST)
    }
}

/// The pause a dispatcher asked for in refusing a call (`grpc-retry-pushback-ms`, which it sets
/// when too many sessions are being opened at once), with a random jitter of up to as much
/// again, so the replicas it refused do not all come back at once; `None` when it asked for
/// none. At most half of [`LONGEST`] before the jitter.
pub(crate) fn pushback(status: &tonic::Status) -> Option<Duration> {
    let hint = kube_dispatch_proto::pushback_of(status)?.min(LONGEST / 2);
    ConstantBuilder::default()
        .with_delay(hint)
        .with_jitter()
        .with_max_times(1)
        .build()
        .next()
}

#[cfg(test)]
mod tests {
    use kube_dispatch_proto::RETRY_PUSHBACK;

    use super::*;

    #[test]
    fn a_pushback_is_waited_with_up_to_as_much_again_and_nothing_else_is_one() {
        let mut refused = tonic::Status::resource_exhausted("busy");
        assert_eq!(pushback(&refused), None, "no hint");
        refused
            .metadata_mut()
            .insert(RETRY_PUSHBACK, "500".parse().expect("a metadata value"));
        let waits: Vec<Duration> = (0..50).filter_map(|_| pushback(&refused)).collect();
        assert_eq!(waits.len(), 50);
        assert!(
            waits
                .iter()
                .all(|w| *w >= Duration::from_millis(500) && *w <= Duration::from_secs(1)),
            "{waits:?}"
        );
        assert!(waits.iter().any(|w| *w != waits[0]), "jittered: {waits:?}");
        refused
            .metadata_mut()
            .insert(RETRY_PUSHBACK, "soon".parse().expect("a metadata value"));
        assert_eq!(pushback(&refused), None, "not a number");
    }

    #[test]
    fn failures_grow_the_pause_and_an_attempt_that_worked_starts_it_again() {
        let mut reconnects = Reconnects::new();
        let first = reconnects.next(false);
        assert!(first >= Duration::from_millis(100) && first <= Duration::from_millis(200));
        let mut last = first;
        for _ in 0..12 {
            last = reconnects.next(false);
        }
        assert!(
            last >= Duration::from_secs(30),
            "grown to the cap: {last:?}"
        );
        assert!(last <= LONGEST);
        // The session that follows worked, then ended: the next attempt is prompt.
        let after = reconnects.next(true);
        assert!(after <= Duration::from_millis(200), "{after:?}");
        // And a failure after it grows from there, not from where the earlier failures left it.
        assert!(reconnects.next(false) <= Duration::from_millis(400));
    }
}
