//! Sessions on dispatchers that died: which this replica held and has ended, which dispatchers
//! the live ones name dead, and reporting the first to the second, so the tier takes a dead
//! dispatcher's keys over without waiting out its handover bound (`dispatcher/HANDOVER.md`,
//! "Ending the wait for a member that died, by reports").
//!
//! A live dispatcher names, in each answer, the dispatchers that died whose sessions it waits
//! to see ended. A session this replica still holds on one of them is fenced at once: its loop
//! ends it as lost, cancelling what it handed out and waiting until every reconcile has
//! returned. A session ended is recorded only then; while its dispatcher is named dead, every
//! poll reports it (its full id, which only this replica knows).
//!
//! Bounds: [`MAX_KEPT`] ended sessions (the last per dispatcher) and [`MAX_KEPT`] dispatchers
//! named dead, each forgotten after [`KEPT_FOR`]; a poll reports at most
//! [`MAX_REPORTS_PER_POLL`].

use std::{
    collections::HashMap,
    sync::{Mutex, MutexGuard},
    time::Duration,
};

use kube_dispatch_proto::v1::EndedSession;
use tokio::{sync::watch, time::Instant};
use tokio_util::sync::CancellationToken;
use tracing::info;

/// Most ended sessions, and most dispatchers named dead, remembered.
pub(super) const MAX_KEPT: usize = 64;

/// How long an ended session, or a dispatcher named dead, is remembered: longer than any
/// handover bound a tier runs with.
pub(super) const KEPT_FOR: Duration = Duration::from_secs(600);

/// Most ended sessions one poll reports (what a dispatcher reads of one).
pub(super) const MAX_REPORTS_PER_POLL: usize = 16;

/// Longest dispatcher id remembered as named dead (a dispatcher's id is a pod name).
const MAX_ID_BYTES: usize = 256;

/// The replica's sessions as the takeover of a dead dispatcher needs them.
#[derive(Debug)]
pub(super) struct Endings {
    inner: Mutex<Inner>,
    /// Moves when a session becomes one to report: each open session then sends the reports
    /// at once with an ack, rather than with its next poll.
    to_report: watch::Sender<u64>,
}

impl Default for Endings {
    fn default() -> Self {
        Self {
            inner: Mutex::default(),
            to_report: watch::channel(0).0,
        }
    }
}

#[derive(Debug, Default)]
struct Inner {
    /// Per dispatcher id: the last session ended there, and when.
    ended: HashMap<String, (String, Instant)>,
    /// Dispatchers named dead, and when last.
    dead: HashMap<String, Instant>,
    /// Sessions open, per dispatcher id: the session's id and the token that fences it.
    open: HashMap<String, (String, CancellationToken)>,
}

impl Endings {
    fn inner(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Session `session_id` was opened on dispatcher `dispatcher`: the token returned is
    /// cancelled when a live dispatcher names `dispatcher` dead.
    pub(super) fn opened(&self, dispatcher: &str, session_id: &str) -> CancellationToken {
        let fence = CancellationToken::new();
        let mut inner = self.inner();
        if inner.dead.contains_key(dispatcher) {
            fence.cancel();
        }
        inner.open.insert(
            dispatcher.to_owned(),
            (session_id.to_owned(), fence.clone()),
        );
        fence
    }

    /// Session `session_id` on `dispatcher` has ended, and every reconcile it handed out has
    /// returned: reported while `dispatcher` is named dead.
    pub(super) fn ended(&self, dispatcher: &str, session_id: &str) {
        let now = Instant::now();
        let mut inner = self.inner();
        if inner
            .open
            .get(dispatcher)
            .is_some_and(|(s, _)| s == session_id)
        {
            inner.open.remove(dispatcher);
        }
        inner
            .ended
            .insert(dispatcher.to_owned(), (session_id.to_owned(), now));
        prune(&mut inner.ended, now, |(_, at)| *at);
        if inner.dead.contains_key(dispatcher) {
            self.to_report.send_modify(|n| *n += 1);
        }
    }

    /// A live dispatcher names `dead` as dispatchers that died: a session still open on one is
    /// fenced.
    pub(super) fn named_dead(&self, dead: &[String]) {
        if dead.is_empty() {
            return;
        }
        let now = Instant::now();
        let mut inner = self.inner();
        for id in dead.iter().filter(|id| id.len() <= MAX_ID_BYTES) {
            if inner.dead.insert(id.clone(), now).is_none() && inner.ended.contains_key(id) {
                self.to_report.send_modify(|n| *n += 1);
            }
            if let Some((session, fence)) = inner.open.get(id)
                && !fence.is_cancelled()
            {
                info!(dispatcher = %id, %session, "a live dispatcher found this session's dispatcher dead: ending the session, cancelling what it handed out, to report it ended");
                fence.cancel();
            }
        }
        prune(&mut inner.dead, now, |at| *at);
    }

    /// Changes when there are new sessions to report.
    pub(super) fn report_changes(&self) -> watch::Receiver<u64> {
        self.to_report.subscribe()
    }

    /// The ended sessions to report with a poll: those on dispatchers named dead.
    pub(super) fn reports(&self) -> Vec<EndedSession> {
        let inner = self.inner();
        if inner.dead.is_empty() {
            return Vec::new();
        }
        inner
            .ended
            .iter()
            .filter(|(dispatcher, _)| inner.dead.contains_key(*dispatcher))
            .take(MAX_REPORTS_PER_POLL)
            .map(|(dispatcher, (session, _))| EndedSession {
                dispatcher_id: dispatcher.clone(),
                session_id: session.clone(),
            })
            .collect()
    }
}

/// Forgets entries older than [`KEPT_FOR`], then the oldest past [`MAX_KEPT`].
fn prune<V>(map: &mut HashMap<String, V>, now: Instant, at: impl Fn(&V) -> Instant) {
    map.retain(|_, v| now.saturating_duration_since(at(v)) < KEPT_FOR);
    while map.len() > MAX_KEPT {
        let Some(oldest) = map
            .iter()
            .min_by_key(|(_, v)| at(v))
            .map(|(k, _)| k.clone())
        else {
            break;
        };
        map.remove(&oldest);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A session open on a dispatcher named dead is fenced; once ended it is reported while
    /// its dispatcher is named dead, and a session on a live dispatcher is not.
    #[tokio::test]
    async fn sessions_on_dispatchers_named_dead_are_fenced_then_reported() {
        let e = Endings::default();
        let on_d1 = e.opened("d1", "s1");
        let on_d2 = e.opened("d2", "s2");
        e.ended("d3", "s3");
        assert!(e.reports().is_empty(), "nobody named dead");
        let mut changes = e.report_changes();
        e.named_dead(&["d1".to_owned()]);
        assert!(on_d1.is_cancelled() && !on_d2.is_cancelled());
        assert!(e.reports().is_empty(), "s1 has not ended yet");
        assert!(!changes.has_changed().unwrap());
        e.ended("d1", "s1");
        assert!(
            changes.has_changed().unwrap(),
            "a session to report at once"
        );
        changes.mark_unchanged();
        let reports = e.reports();
        assert_eq!(reports.len(), 1);
        assert_eq!(
            (
                reports[0].dispatcher_id.as_str(),
                reports[0].session_id.as_str()
            ),
            ("d1", "s1")
        );
        // A session opened on a dispatcher already named dead is fenced at once.
        assert!(e.opened("d1", "s4").is_cancelled());
        e.named_dead(&["d3".to_owned()]);
        assert!(
            changes.has_changed().unwrap(),
            "d3 named dead: s3 to report"
        );
        assert_eq!(e.reports().len(), 2, "s3 ended before d3 was named dead");
    }

    #[tokio::test]
    async fn what_is_remembered_is_bounded() {
        let e = Endings::default();
        for i in 0..=MAX_KEPT {
            e.ended(&format!("d{i}"), "s");
        }
        let names: Vec<String> = (0..=MAX_KEPT).map(|i| format!("d{i}")).collect();
        e.named_dead(&names);
        let inner = e.inner();
        assert_eq!(inner.ended.len(), MAX_KEPT);
        assert_eq!(inner.dead.len(), MAX_KEPT);
        drop(inner);
        assert_eq!(e.reports().len(), MAX_REPORTS_PER_POLL);
    }
}
