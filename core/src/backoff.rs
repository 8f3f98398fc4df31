//! Exponential backoff: per key for failed reconciles, and per watch for its retries.

use std::time::Duration;

/// Exponential backoff: `base * 2^(failures - 1)`, capped at `cap`. client-go's default for
/// controllers is 5 ms doubling to 1000 s, which is also ours.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// Delay after the first failure.
    pub base: Duration,
    /// Longest delay, reached after enough consecutive failures.
    pub cap: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            base: Duration::from_millis(5),
            cap: Duration::from_secs(1000),
        }
    }
}

impl Backoff {
    /// The delay before retrying after `failures` consecutive failures (1 for the first).
    pub fn delay(&self, failures: u32) -> Duration {
        let exponent = failures.saturating_sub(1).min(63);
        self.base
            .checked_mul(1u32.checked_shl(exponent).unwrap_or(u32::MAX))
            .map_or(self.cap, |d| d.min(self.cap))
    }
}

/// When a broken watch of the API server tries again.
///
/// A watch's view is stale from the moment it breaks until it resumes or lists again: a change
/// made meanwhile is seen late, and a deletion is found only by the list's sweep, by this
/// process. So the wait is short and bounded ([`WatchRetry::BACKOFF`]: 250 ms doubling to 2 s;
/// a dispatcher holds a handful of watches, so even at the cap they cost the API server a few
/// requests a second while it is down), and a **410 Gone** is answered by listing again at
/// once: the server answered, only the resourceVersion is too old, and waiting would add
/// nothing but staleness (kube-runtime's default backoff waits up to 30 s here, and after an
/// API-server restart its connection errors have already grown it to several seconds).
///
/// A second 410 before a list completed waits like any error, so a server that answers every
/// list with a resourceVersion it then refuses is not listed in a loop.
#[derive(Clone, Debug)]
pub struct WatchRetry {
    failures: u32,
    listed_since_gone: bool,
}

impl Default for WatchRetry {
    fn default() -> Self {
        Self {
            failures: 0,
            listed_since_gone: true,
        }
    }
}

impl WatchRetry {
    /// The delays between failed tries, before jitter.
    pub const BACKOFF: Backoff = Backoff {
        base: Duration::from_millis(250),
        cap: Duration::from_secs(2),
    };

    /// The watch showed something (an object, a list's start or end): it works again.
    /// `list_done` when a list completed.
    pub fn succeeded(&mut self, list_done: bool) {
        self.failures = 0;
        self.listed_since_gone |= list_done;
    }

    /// The watch failed; `gone` for a 410 Gone. Returns how long to wait before trying again:
    /// zero for a 410 Gone after a completed list.
    pub fn failed(&mut self, gone: bool) -> Duration {
        if gone && std::mem::replace(&mut self.listed_since_gone, false) {
            return Duration::ZERO;
        }
        self.failures = self.failures.saturating_add(1);
        Self::BACKOFF.delay(self.failures)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn doubles_from_base_to_cap() {
        let b = Backoff::default();
        assert_eq!(b.delay(1), Duration::from_millis(5));
        assert_eq!(b.delay(2), Duration::from_millis(10));
        assert_eq!(b.delay(3), Duration::from_millis(20));
        assert_eq!(b.delay(18), Duration::from_millis(5 << 17).min(b.cap));
        assert_eq!(b.delay(40), b.cap);
        assert_eq!(b.delay(u32::MAX), b.cap);
    }

    #[test]
    fn a_watch_lists_again_at_once_after_a_gone_but_not_twice_in_a_row() {
        let mut r = WatchRetry::default();
        // Connection errors while the API server is down back off, up to the cap.
        let waits: Vec<_> = (0..5).map(|_| r.failed(false)).collect();
        assert_eq!(
            waits,
            [250, 500, 1000, 2000, 2000].map(Duration::from_millis)
        );
        // It answers again, with 410 Gone: list at once.
        assert_eq!(r.failed(true), Duration::ZERO);
        // The list fails with 410 again before it completes: wait, without starting over.
        assert_eq!(r.failed(true), Duration::from_millis(2000));
        // The list starts (something was shown): the backoff starts over; a 410 before the
        // list completes still waits.
        r.succeeded(false);
        assert_eq!(r.failed(true), Duration::from_millis(250));
        // Once a list completed, the next 410 lists at once again.
        r.succeeded(true);
        assert_eq!(r.failed(true), Duration::ZERO);
        assert_eq!(r.failed(false), Duration::from_millis(250));
    }

    proptest! {
        #[test]
        fn never_shrinks_and_never_exceeds_cap(base_ms in 1u64..10_000, cap_s in 1u64..100_000, n in 1u32..200) {
            let b = Backoff { base: Duration::from_millis(base_ms), cap: Duration::from_secs(cap_s) };
            prop_assert!(b.delay(n) <= b.cap);
            prop_assert!(b.delay(n + 1) >= b.delay(n));
        }
    }
}
