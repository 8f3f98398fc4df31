//! Exponential backoff: per key for failed reconciles, and per watch for its retries.

use std::time::{Duration, Instant};

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

/// What broke a watch, as its recovery policy ([`WatchRetry::recover`]) sees it: the caller
/// reads it off the client's error.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WatchFailure {
    /// The API server's status code, if it answered one.
    pub code: Option<u16>,
    /// The watch lists by streaming (`sendInitialEvents`) and the server refused it (a server
    /// without the WatchList feature: off by default in Kubernetes 1.33, missing before 1.27).
    pub streaming_refused: bool,
    /// The watch lists whole and the list was cut short or timed out (a resource too large to
    /// list in one response within the API server's request timeout).
    pub whole_list_cut_short: bool,
    /// The watch has shown nothing yet: it is starting.
    pub starting: bool,
}

/// What a broken watch does next ([`WatchRetry::recover`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recovery {
    /// List again at once: the server answered, only the resourceVersion is too old (410
    /// Gone).
    ListAgain,
    /// List in pages from now on, at once: the server refused a streaming list.
    ListInPages,
    /// List by streaming from now on, at once: a whole list was cut short. A streaming list
    /// (one WATCH with `sendInitialEvents`) is a long-running request, which the API server's
    /// request timeout does not end, served from its watch cache with no `continue` to expire,
    /// so it completes where a whole list cannot; pages can not either once listing them takes
    /// longer than the API server's compaction interval (5 minutes by default: at a million
    /// objects on two cores, `BENCHMARKS.md`). A server that refuses it is then listed in pages.
    ListByStreaming,
    /// Try again after this long.
    RetryIn(Duration),
    /// Give up: the request itself is refused (a 4xx other than 410 Gone, 408 and 429: a bad
    /// selector, a missing permission) before the watch ever started, which the caller
    /// reports. A 429 (the API server's priority and fairness holding the identity back) and a
    /// 408 say "not now", not "never": they are retried like a server error.
    Fail,
}

/// The recovery policy of a watch of the API server: what it does when it breaks.
///
/// A watch's view is stale from the moment it breaks until it resumes or lists again: a change
/// made meanwhile is seen late, and a deletion is found only by the list's sweep, by this
/// process. So the wait is short and bounded: 125 ms doubling to 1 s, each with a random
/// jitter of up to as much again, so at most 2 s (a dispatcher holds a handful of watches, so
/// even at the cap they cost the API server a few requests a second while it is down). A
/// **410 Gone** is answered by listing again at once: the server answered, and waiting would
/// add nothing but staleness (kube-runtime's default backoff waits up to 30 s there, and after
/// an API-server restart its connection errors have already grown it to seconds). A second
/// 410 before a list completed waits like any error, so a server that answers every list with
/// a resourceVersion it then refuses is not listed in a loop.
#[derive(Debug)]
pub struct WatchRetry {
    delays: backon::ExponentialBackoff,
    /// Whether the waits have grown since they last started over.
    waited: bool,
    listed_since_gone: bool,
    /// When a 410 Gone was last answered by listing at once.
    listed_at_once: Option<Instant>,
}

impl Default for WatchRetry {
    fn default() -> Self {
        Self {
            delays: Self::delays(),
            waited: false,
            listed_since_gone: true,
            listed_at_once: None,
        }
    }
}

impl WatchRetry {
    /// The longest wait between tries, jitter included.
    pub const MAX_WAIT: Duration = Duration::from_secs(2);

    /// At most one 410 Gone in this long is answered by listing at once: a server that
    /// completes every list and then refuses to watch from it is not listed in a loop.
    pub const LIST_AT_ONCE_EVERY: Duration = Duration::from_secs(10);

    fn delays() -> backon::ExponentialBackoff {
        use backon::BackoffBuilder;
        backon::ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(125))
            .with_max_delay(Self::MAX_WAIT / 2)
            .with_factor(2.0)
            .with_jitter()
            .without_max_times()
            .build()
    }

    /// The API server showed an object, or the end of a list: the watch works again. (Not the
    /// start of a list, which a paged list announces before asking anything.) `list_done` when
    /// a list completed.
    pub fn succeeded(&mut self, list_done: bool) {
        if std::mem::take(&mut self.waited) {
            self.delays = Self::delays();
        }
        self.listed_since_gone |= list_done;
    }

    /// What to do about `failure`, at `now`.
    pub fn recover(&mut self, failure: &WatchFailure, now: Instant) -> Recovery {
        if failure.streaming_refused {
            return Recovery::ListInPages;
        }
        if failure.whole_list_cut_short {
            return Recovery::ListByStreaming;
        }
        let at_once_allowed = self
            .listed_at_once
            .is_none_or(|at| now.saturating_duration_since(at) >= Self::LIST_AT_ONCE_EVERY);
        match failure.code {
            Some(410) if at_once_allowed && std::mem::take(&mut self.listed_since_gone) => {
                self.listed_at_once = Some(now);
                return Recovery::ListAgain;
            }
            Some(code @ 400..=499) if !matches!(code, 408 | 410 | 429) && failure.starting => {
                return Recovery::Fail;
            }
            _ => {}
        }
        self.waited = true;
        Recovery::RetryIn(self.delays.next().unwrap_or(Self::MAX_WAIT))
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

    fn waits(r: &mut WatchRetry, failure: &WatchFailure) -> Duration {
        match r.recover(failure, Instant::now()) {
            Recovery::RetryIn(d) => d,
            other => panic!("expected a wait, got {other:?}"),
        }
    }

    #[test]
    fn a_watch_lists_again_at_once_after_a_gone_but_not_twice_in_a_row() {
        let mut r = WatchRetry::default();
        let now = Instant::now();
        let down = WatchFailure::default();
        let gone = WatchFailure {
            code: Some(410),
            ..down
        };
        // Connection errors while the API server is down wait longer each time, jittered
        // within [d, 2d), up to 2 s.
        let mins = [125, 250, 500, 1000, 1000, 1000].map(Duration::from_millis);
        for min in mins {
            let wait = waits(&mut r, &down);
            assert!(min <= wait && wait < min * 2, "{wait:?} for {min:?}");
            assert!(wait <= WatchRetry::MAX_WAIT);
        }
        // It answers again, with 410 Gone: list at once.
        assert_eq!(r.recover(&gone, now), Recovery::ListAgain);
        // The list fails with 410 again before it completes: wait, without starting over.
        assert!(waits(&mut r, &gone) >= Duration::from_secs(1));
        // The start of a list (announced before anything is asked) does not start the waits
        // over; an object shown does, and a 410 before the list completes still waits.
        r.succeeded(false);
        assert!(waits(&mut r, &gone) < Duration::from_millis(250));
        // A list completed, but a 410 came within 10 s of the last list at once: wait.
        r.succeeded(true);
        let soon = now + Duration::from_secs(5);
        assert!(matches!(r.recover(&gone, soon), Recovery::RetryIn(_)));
        // Later, a 410 after a completed list lists at once again.
        let later = now + WatchRetry::LIST_AT_ONCE_EVERY;
        assert_eq!(r.recover(&gone, later), Recovery::ListAgain);
    }

    /// A server that completes every list and then refuses to watch from it is listed at most
    /// once in 10 s without a wait.
    #[test]
    fn a_server_refusing_every_watch_after_its_list_is_not_listed_in_a_loop() {
        let mut r = WatchRetry::default();
        let start = Instant::now();
        let gone = WatchFailure {
            code: Some(410),
            ..WatchFailure::default()
        };
        let mut at = start;
        let mut at_once = 0;
        while at < start + Duration::from_secs(60) {
            r.succeeded(true);
            match r.recover(&gone, at) {
                Recovery::ListAgain => at_once += 1,
                Recovery::RetryIn(wait) => at += wait,
                other => panic!("{other:?}"),
            }
            at += Duration::from_millis(10);
        }
        assert!(at_once <= 7, "{at_once} lists at once in a minute");
    }

    #[test]
    fn a_refused_request_fails_a_starting_watch_and_is_retried_by_a_running_one() {
        let forbidden = WatchFailure {
            code: Some(403),
            starting: true,
            ..WatchFailure::default()
        };
        assert_eq!(
            WatchRetry::default().recover(&forbidden, Instant::now()),
            Recovery::Fail
        );
        let running = WatchFailure {
            starting: false,
            ..forbidden
        };
        assert!(matches!(
            WatchRetry::default().recover(&running, Instant::now()),
            Recovery::RetryIn(_)
        ));
        // A server error is retried even while starting, and so is the API server holding
        // the identity back (429 from priority and fairness) or timing the request out.
        for code in [503, 429, 408] {
            let not_now = WatchFailure {
                code: Some(code),
                ..forbidden
            };
            assert!(
                matches!(
                    WatchRetry::default().recover(&not_now, Instant::now()),
                    Recovery::RetryIn(_)
                ),
                "{code}"
            );
        }
    }

    #[test]
    fn a_refused_stream_lists_in_pages_and_a_whole_list_cut_short_streams_at_once() {
        let refused = WatchFailure {
            code: Some(422),
            streaming_refused: true,
            starting: true,
            ..WatchFailure::default()
        };
        let cut_short = WatchFailure {
            code: Some(504),
            whole_list_cut_short: true,
            ..WatchFailure::default()
        };
        for (failure, recovery) in [
            (refused, Recovery::ListInPages),
            (cut_short, Recovery::ListByStreaming),
        ] {
            assert_eq!(
                WatchRetry::default().recover(&failure, Instant::now()),
                recovery,
                "{failure:?}"
            );
        }
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
