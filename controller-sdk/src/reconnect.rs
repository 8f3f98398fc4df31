//! How a replica paces its reconnects, to a dispatcher or to the load balancer.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};

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

#[cfg(test)]
mod tests {
    use super::*;

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
