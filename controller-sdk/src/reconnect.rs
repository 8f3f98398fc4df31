//! How a replica paces its reconnects, to a dispatcher or to the load balancer.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};

/// Delays between reconnect attempts: 100 ms doubling to 30 s, with jitter, without end.
pub(crate) fn reconnect_backoff() -> impl Iterator<Item = Duration> + Send {
    ExponentialBuilder::default()
        .with_jitter()
        .with_min_delay(Duration::from_millis(100))
        .with_max_delay(Duration::from_secs(30))
        .without_max_times()
        .build()
}
