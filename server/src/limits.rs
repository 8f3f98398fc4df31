//! Request rate per identity: one ServiceAccount that calls too fast is answered
//! RESOURCE_EXHAUSTED while every other identity is served as before.
//!
//! Each identity (its Kubernetes user name) gets a GCRA limiter of its own (`governor`):
//! [`RequestRate::per_second`] sustained, bursts of up to [`RequestRate::burst`]. The limiters
//! live in a bounded map (at most the auth cache size, about 100 bytes each); an identity idle
//! for a minute loses its limiter, which would have refilled by then anyway.

use std::{num::NonZeroU32, sync::Arc, time::Duration};

use governor::{
    Quota, RateLimiter,
    clock::{Clock, DefaultClock},
    state::{InMemoryState, NotKeyed},
};

/// How fast one identity may call one server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestRate {
    /// Requests per second, sustained.
    pub per_second: NonZeroU32,
    /// Requests at once after a quiet spell.
    pub burst: NonZeroU32,
}

impl Default for RequestRate {
    /// 1 000 requests per second, bursts of 2 000: far above what the SDK sends (a poll and
    /// an ack per batch per session), low enough that a runaway client cannot starve the
    /// others on a 2-core dispatcher.
    fn default() -> Self {
        Self {
            per_second: NonZeroU32::new(1_000).expect("non-zero"),
            burst: NonZeroU32::new(2_000).expect("non-zero"),
        }
    }
}

/// A caller over its rate.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "{user} sent more than {per_second} requests per second (bursts of {burst}) to this server: retry in {retry_after:?}"
)]
pub struct RateExceeded {
    /// Who.
    pub user: String,
    /// The sustained rate allowed.
    pub per_second: u32,
    /// The burst allowed.
    pub burst: u32,
    /// When the next request would pass.
    pub retry_after: Duration,
}

type Limiter = RateLimiter<NotKeyed, InMemoryState, DefaultClock>;

/// The limiters of every identity seen lately.
#[derive(Clone)]
pub struct RateLimits {
    rate: RequestRate,
    quota: Quota,
    clock: DefaultClock,
    limiters: moka::sync::Cache<String, Arc<Limiter>>,
}

impl std::fmt::Debug for RateLimits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimits")
            .field("rate", &self.rate)
            .field("identities", &self.limiters.entry_count())
            .finish()
    }
}

impl RateLimits {
    /// `rate` for each identity, remembering at most `capacity` identities.
    pub fn new(rate: RequestRate, capacity: u64) -> Self {
        let refill =
            Duration::from_secs_f64(f64::from(rate.burst.get()) / f64::from(rate.per_second.get()));
        Self {
            rate,
            quota: Quota::per_second(rate.per_second).allow_burst(rate.burst),
            clock: DefaultClock::default(),
            limiters: moka::sync::Cache::builder()
                .max_capacity(capacity)
                // An evicted limiter comes back full: only evict once it would have refilled.
                .time_to_idle(refill.max(Duration::from_secs(60)))
                .build(),
        }
    }

    /// Counts one request of `user` if `user` was counted lately (it has a limiter); refused
    /// when it is over its rate. One not seen lately passes and is not remembered.
    pub fn check_if_known(&self, user: &str) -> Result<(), RateExceeded> {
        if self.limiters.contains_key(user) {
            self.check(user)
        } else {
            Ok(())
        }
    }

    /// Counts one request of `user`; refused when `user` is over its rate.
    pub fn check(&self, user: &str) -> Result<(), RateExceeded> {
        let limiter = self
            .limiters
            .get_with_by_ref(user, || Arc::new(RateLimiter::direct(self.quota)));
        limiter.check().map_err(|not_until| RateExceeded {
            user: user.to_owned(),
            per_second: self.rate.per_second.get(),
            burst: self.rate.burst.get(),
            retry_after: not_until.wait_time_from(self.clock.now()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rate(per_second: u32, burst: u32) -> RequestRate {
        RequestRate {
            per_second: NonZeroU32::new(per_second).unwrap(),
            burst: NonZeroU32::new(burst).unwrap(),
        }
    }

    #[test]
    fn one_identity_over_its_rate_leaves_the_others_alone() {
        let limits = RateLimits::new(rate(1, 3), 100);
        for _ in 0..3 {
            limits.check("greedy").unwrap();
        }
        let refused = limits.check("greedy").unwrap_err();
        assert_eq!((refused.per_second, refused.burst), (1, 3));
        assert!(
            refused.retry_after > Duration::ZERO && refused.retry_after <= Duration::from_secs(1)
        );
        assert!(
            refused
                .to_string()
                .starts_with("greedy sent more than 1 requests per second")
        );
        for _ in 0..3 {
            limits.check("modest").unwrap();
        }
        assert!(limits.check("greedy").is_err());
    }
}
