//! Per-key exponential backoff for failed reconciles.

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

    proptest! {
        #[test]
        fn never_shrinks_and_never_exceeds_cap(base_ms in 1u64..10_000, cap_s in 1u64..100_000, n in 1u32..200) {
            let b = Backoff { base: Duration::from_millis(base_ms), cap: Duration::from_secs(cap_s) };
            prop_assert!(b.delay(n) <= b.cap);
            prop_assert!(b.delay(n + 1) >= b.delay(n));
        }
    }
}
