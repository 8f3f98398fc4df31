//! How a replica paces its reconnects, to a dispatcher or to the load balancer.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};

/// Delays between reconnect attempts, without end: 100 ms doubling to 30 s, each with a random
/// jitter of up to as much again (so at most 60 s).
pub(crate) fn reconnect_backoff() -> impl Iterator<Item = Duration> + Send {
    ExponentialBuilder::default()
        .with_jitter()
        .with_min_delay(Duration::from_millis(100))
        .with_max_delay(Duration::from_secs(30))
        .without_max_times()
        .build()
}
