//! How many deliveries a poll asks for: the free slots, and while the replica's reconciles are
//! quick, up to [`crate::Controller::prefetch`] more, which wait in the replica for a slot.
//!
//! A poll that asks for no more than the free slots leaves every slot a replica frees idle for
//! a round trip to the dispatcher: with 16 slots and a round trip of a millisecond it runs at
//! most 16 000 reconciles a second however little each costs, which is what bounded a cold
//! start of 10 000 quick reconciles on one replica. Asking for more than the free slots keeps
//! work at hand while the next poll travels.
//!
//! A delivery's deadline runs while it waits, and a key waiting here is a key no other replica
//! can take, so more is asked for only while every reconcile of the last full window (twice the
//! concurrency) and of the current one held its slot for at most an eighth of the reconcile
//! limit divided by the sessions open. A delivery whose deadline passed, while it waited or
//! ran, counts as slow; a slow one turns asking ahead off until the window it ended in and one
//! more full window of quick ones have passed.
//!
//! The sessions poll at once, one per dispatcher, and each asks for the free slots and the
//! prefetch less what already waits, so when their answers arrive together up to `sessions ×
//! (concurrency + prefetch)` deliveries are here: with the prefetch at the concurrency a
//! delivery waits behind at most `2 × sessions − 1` reconciles per slot, each within
//! `limit / (8 × sessions)`, which keeps its wait under a quarter of the limit however many
//! dispatchers the replica polls. What is weighed is how long a slot was held: a delivery
//! refused at once (its key already running here) counts as the quick one it was.

use std::{sync::Mutex, time::Duration};

/// What the replica's last reconciles took, and how far ahead its polls may ask.
#[derive(Debug)]
pub(super) struct Prefetch {
    /// Most deliveries asked for beyond the free slots (0: never more than the free slots).
    most: usize,
    /// Reconciles in a window.
    window: usize,
    pace: Mutex<Pace>,
}

#[derive(Debug, Default)]
struct Pace {
    /// Reconciles ended in the current window, and the longest of them.
    ended: usize,
    slowest: Duration,
    /// The longest reconcile of the last full window; `None` before one has ended.
    before: Option<Duration>,
}

impl Prefetch {
    /// Up to `most` beyond the free slots, for a replica of `concurrency` slots.
    pub(super) fn new(most: usize, concurrency: usize) -> Self {
        Self {
            most,
            window: concurrency.saturating_mul(2).max(1),
            pace: Mutex::default(),
        }
    }

    /// A reconcile ended after running for `took`.
    pub(super) fn ended(&self, took: Duration) {
        let mut pace = self.pace.lock().unwrap_or_else(|e| e.into_inner());
        pace.ended += 1;
        pace.slowest = pace.slowest.max(took);
        if pace.ended >= self.window {
            pace.before = Some(pace.slowest);
            pace.ended = 0;
            pace.slowest = Duration::ZERO;
        }
    }

    /// How many deliveries to ask for with `free` slots free and `waiting` deliveries already
    /// waiting for one, reconciles being allowed `limit` each and `sessions` sessions polling.
    pub(super) fn ask(
        &self,
        free: usize,
        waiting: usize,
        limit: Duration,
        sessions: usize,
    ) -> usize {
        let quick_enough =
            limit / u32::try_from(sessions.max(1).saturating_mul(8)).unwrap_or(u32::MAX);
        let pace = self.pace.lock().unwrap_or_else(|e| e.into_inner());
        let quick = pace
            .before
            .is_some_and(|before| before.max(pace.slowest) <= quick_enough);
        let ahead = if quick { self.most } else { 0 };
        (free + ahead).saturating_sub(waiting)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMIT: Duration = Duration::from_secs(54);
    const QUICK: Duration = Duration::from_millis(2);

    fn ended(prefetch: &Prefetch, n: usize, took: Duration) {
        for _ in 0..n {
            prefetch.ended(took);
        }
    }

    #[test]
    fn more_than_the_free_slots_only_after_a_window_of_quick_reconciles() {
        let prefetch = Prefetch::new(4, 2);
        assert_eq!(prefetch.ask(2, 0, LIMIT, 1), 2, "nothing known yet");
        ended(&prefetch, 3, QUICK);
        assert_eq!(
            prefetch.ask(2, 0, LIMIT, 1),
            2,
            "a window is four reconciles"
        );
        ended(&prefetch, 1, QUICK);
        assert_eq!(prefetch.ask(2, 0, LIMIT, 1), 6);
        assert_eq!(
            prefetch.ask(0, 0, LIMIT, 1),
            4,
            "ahead with every slot busy"
        );
        assert_eq!(prefetch.ask(0, 3, LIMIT, 1), 1, "less what already waits");
        assert_eq!(prefetch.ask(1, 9, LIMIT, 1), 0);
    }

    #[test]
    fn a_slow_reconcile_stops_it_until_a_quick_window_follows_its_own() {
        let prefetch = Prefetch::new(4, 2);
        ended(&prefetch, 4, QUICK);
        assert_eq!(prefetch.ask(1, 0, LIMIT, 1), 5);
        // One reconcile of more than an eighth of the limit, in the current window.
        prefetch.ended(LIMIT / 8 + Duration::from_millis(1));
        assert_eq!(prefetch.ask(1, 0, LIMIT, 1), 1);
        ended(&prefetch, 3, QUICK);
        assert_eq!(
            prefetch.ask(1, 0, LIMIT, 1),
            1,
            "the last full window had it"
        );
        ended(&prefetch, 4, QUICK);
        assert_eq!(prefetch.ask(1, 0, LIMIT, 1), 5, "two quick windows since");
        // Exactly an eighth is quick enough.
        prefetch.ended(LIMIT / 8);
        assert_eq!(prefetch.ask(1, 0, LIMIT, 1), 5);
    }

    #[test]
    fn none_ahead_when_turned_off() {
        let prefetch = Prefetch::new(0, 2);
        ended(&prefetch, 8, QUICK);
        assert_eq!(prefetch.ask(2, 0, LIMIT, 1), 2);
        assert_eq!(prefetch.ask(0, 0, LIMIT, 1), 0);
    }

    #[test]
    fn the_sessions_polling_share_what_counts_as_quick() {
        let prefetch = Prefetch::new(4, 2);
        ended(&prefetch, 4, LIMIT / 24);
        assert_eq!(
            prefetch.ask(1, 0, LIMIT, 3),
            5,
            "within an eighth of the limit over 3"
        );
        assert_eq!(
            prefetch.ask(1, 0, LIMIT, 0),
            5,
            "no session open counts as one"
        );
        assert_eq!(
            prefetch.ask(1, 0, LIMIT, 4),
            1,
            "too slow for 4 sessions at once"
        );
    }
}
