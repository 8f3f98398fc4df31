//! Sessions on dispatchers that died: which this replica held and has ended, which dispatchers
//! the live ones name dead, and reporting the first to the second, so the tier takes a dead
//! dispatcher's keys over without waiting out its handover bound (`dispatcher/HANDOVER.md`,
//! "Ending the wait for a member that died, by reports").
//!
//! A live dispatcher names, in each answer, the dispatchers that died whose sessions it waits
//! to see ended. A session this replica holds on one of them when it is named is fenced at
//! once: its loop ends it as lost, cancelling what it handed out and waiting until every
//! reconcile has returned. A session ended is recorded only then; while its dispatcher is
//! named dead (in the last answer of some session), every poll reports it, and each session
//! reports it at once with an ack (its full id, which only this replica knows). A session
//! opened on a dispatcher named dead is not fenced: a dead or cut-off dispatcher can list no
//! new session on its Lease, so it hands it nothing the others wait for.
//!
//! A dispatcher restarted after a crash says so in its answers (`previous_process_died`): it
//! waits for the sessions its previous process listed, which bear the same dispatcher id. Those
//! this replica ended there are reported as for a dispatcher named dead; the session the answer
//! came on is the new process's and is not fenced. A session still held with the previous
//! process (not yet noticed gone) ends by itself as its calls fail, and is reported then.
//!
//! Bounds: the last [`ENDED_PER_DISPATCHER`] ended sessions of at most [`MAX_KEPT`]
//! dispatchers, each forgotten after [`KEPT_FOR`]; one list of dispatchers named dead per open
//! session (at most [`MAX_KEPT`] ids each); a poll reports at most [`MAX_REPORTS_PER_POLL`].

use std::{
    collections::{HashMap, HashSet},
    sync::{Mutex, MutexGuard},
    time::Duration,
};

use kube_dispatch_proto::v1::EndedSession;
use tokio::{sync::watch, time::Instant};
use tokio_util::sync::CancellationToken;
use tracing::info;

/// Most dispatchers whose ended sessions are remembered, and most ids one answer names dead.
pub(super) const MAX_KEPT: usize = 64;

/// Most ended sessions remembered per dispatcher: a replica that reconnected to a dispatcher
/// shortly before it died ended several sessions there, each still listed on its Lease.
pub(super) const ENDED_PER_DISPATCHER: usize = 4;

/// How long an ended session is remembered: longer than any handover bound a tier runs with.
pub(super) const KEPT_FOR: Duration = Duration::from_secs(600);

/// Most ended sessions one poll reports (what a dispatcher reads of one).
pub(super) const MAX_REPORTS_PER_POLL: usize = 16;

/// Longest dispatcher id taken as named dead (a dispatcher's id is a pod name).
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
    /// Where the next poll's reports start among those to report, so that past
    /// [`MAX_REPORTS_PER_POLL`] every one goes out in turn.
    cursor: usize,
    /// Per dispatcher id: the sessions ended there, newest last, each with when.
    ended: HashMap<String, Vec<(String, Instant)>>,
    /// Per dispatcher id of an open session: the dispatchers its last answer named dead.
    named: HashMap<String, Vec<String>>,
    /// Sessions open, per dispatcher id: the session's id and the token that fences it.
    open: HashMap<String, (String, CancellationToken)>,
}

impl Inner {
    fn is_dead(&self, dispatcher: &str) -> bool {
        self.named
            .values()
            .any(|ids| ids.iter().any(|id| id == dispatcher))
    }
}

impl Endings {
    fn inner(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Session `session_id` was opened on dispatcher `dispatcher`: the token returned is
    /// cancelled when a live dispatcher names `dispatcher` dead while the session is open.
    pub(super) fn opened(&self, dispatcher: &str, session_id: &str) -> CancellationToken {
        let fence = CancellationToken::new();
        self.inner().open.insert(
            dispatcher.to_owned(),
            (session_id.to_owned(), fence.clone()),
        );
        fence
    }

    /// Session `session_id` on `dispatcher` has ended, and every reconcile it handed out has
    /// returned: reported while `dispatcher` is named dead. What its answers named dead is
    /// forgotten.
    pub(super) fn ended(&self, dispatcher: &str, session_id: &str) {
        let now = Instant::now();
        let mut inner = self.inner();
        if inner
            .open
            .get(dispatcher)
            .is_some_and(|(s, _)| s == session_id)
        {
            inner.open.remove(dispatcher);
            inner.named.remove(dispatcher);
        }
        let sessions = inner.ended.entry(dispatcher.to_owned()).or_default();
        sessions.retain(|(s, _)| s != session_id);
        sessions.push((session_id.to_owned(), now));
        if sessions.len() > ENDED_PER_DISPATCHER {
            sessions.remove(0);
        }
        for sessions in inner.ended.values_mut() {
            sessions.retain(|(_, at)| now.saturating_duration_since(*at) < KEPT_FOR);
        }
        inner.ended.retain(|_, sessions| !sessions.is_empty());
        while inner.ended.len() > MAX_KEPT {
            let oldest = inner
                .ended
                .iter()
                .min_by_key(|(_, sessions)| sessions.last().map(|(_, at)| *at))
                .map(|(id, _)| id.clone());
            let Some(oldest) = oldest else { break };
            inner.ended.remove(&oldest);
        }
        if inner.is_dead(dispatcher) {
            self.to_report.send_modify(|n| *n += 1);
        }
    }

    /// The last answer on the session with dispatcher `source` named `dead` as dispatchers that
    /// died, and said whether `source`'s own previous process died (`previous`): a session open
    /// on one of `dead` is fenced; the sessions ended on all of them are reported.
    pub(super) fn named_dead(&self, source: &str, dead: &[String], previous: bool) {
        let mut inner = self.inner();
        let mut dead: Vec<String> = dead
            .iter()
            .filter(|id| id.len() <= MAX_ID_BYTES && *id != source)
            .take(MAX_KEPT)
            .cloned()
            .collect();
        let before: HashSet<String> = inner.named.values().flatten().cloned().collect();
        let mut report = false;
        for id in &dead {
            if !before.contains(id) && inner.ended.contains_key(id) {
                report = true;
            }
            if let Some((session, fence)) = inner.open.get(id)
                && !fence.is_cancelled()
            {
                info!(dispatcher = %id, %session, "a live dispatcher found this session's dispatcher dead: ending the session, cancelling what it handed out, to report it ended");
                fence.cancel();
            }
        }
        // Not fenced: the session open there is the answering (new) process's.
        if previous {
            if !before.contains(source) && inner.ended.contains_key(source) {
                report = true;
            }
            dead.push(source.to_owned());
        }
        if dead.is_empty() {
            inner.named.remove(source);
        } else if inner.open.contains_key(source) {
            inner.named.insert(source.to_owned(), dead);
        }
        drop(inner);
        if report {
            self.to_report.send_modify(|n| *n += 1);
        }
    }

    /// Changes when there are new sessions to report.
    pub(super) fn report_changes(&self) -> watch::Receiver<u64> {
        self.to_report.subscribe()
    }

    /// The ended sessions to report with a poll: those on dispatchers named dead, newest first;
    /// past [`MAX_REPORTS_PER_POLL`], each call starts where the last one stopped.
    pub(super) fn reports(&self) -> Vec<EndedSession> {
        let mut inner = self.inner();
        if inner.named.is_empty() {
            return Vec::new();
        }
        let mut all: Vec<(Instant, &String, &String)> = inner
            .ended
            .iter()
            .filter(|(dispatcher, _)| inner.is_dead(dispatcher))
            .flat_map(|(dispatcher, sessions)| {
                sessions
                    .iter()
                    .map(move |(session, at)| (*at, dispatcher, session))
            })
            .collect();
        if all.is_empty() {
            return Vec::new();
        }
        // A total order, so that the cursor walks the same sequence from one call to the next.
        all.sort_unstable_by(|a, b| b.0.cmp(&a.0).then_with(|| (a.1, a.2).cmp(&(b.1, b.2))));
        let start = if all.len() > MAX_REPORTS_PER_POLL {
            inner.cursor % all.len()
        } else {
            0
        };
        let reports: Vec<EndedSession> = all
            .iter()
            .cycle()
            .skip(start)
            .take(all.len().min(MAX_REPORTS_PER_POLL))
            .map(|(_, dispatcher, session)| EndedSession {
                dispatcher_id: (*dispatcher).clone(),
                session_id: (*session).clone(),
            })
            .collect();
        inner.cursor = (start + reports.len()) % all.len();
        reports
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A session open on a dispatcher named dead is fenced; once ended it is reported while
    /// some open session's last answer names its dispatcher dead, and a session on a live
    /// dispatcher is not.
    #[tokio::test]
    async fn sessions_on_dispatchers_named_dead_are_fenced_then_reported() {
        let e = Endings::default();
        let on_d1 = e.opened("d1", "s1");
        let on_d2 = e.opened("d2", "s2");
        e.ended("d3", "s3");
        assert!(e.reports().is_empty(), "nobody named dead");
        let mut changes = e.report_changes();
        e.named_dead("d2", &["d1".to_owned()], false);
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
        // A session opened on a dispatcher named dead is not fenced for it (a dead or cut-off
        // dispatcher cannot list it); named again, it is.
        let on_d1_again = e.opened("d1", "s4");
        assert!(!on_d1_again.is_cancelled());
        e.named_dead("d2", &["d1".to_owned(), "d3".to_owned()], false);
        assert!(on_d1_again.is_cancelled());
        assert!(
            changes.has_changed().unwrap(),
            "d3 named dead: s3 to report"
        );
        assert_eq!(e.reports().len(), 2, "s3 ended before d3 was named dead");
        e.ended("d1", "s4");
        assert_eq!(e.reports().len(), 3, "both of d1's sessions");
        // d2's next answer names nobody: nothing is reported any more.
        e.named_dead("d2", &[], false);
        assert!(e.reports().is_empty());
    }

    /// A dispatcher restarted after a crash says its previous process died: the sessions ended
    /// on its id are reported, and the session its answer came on goes on; a dispatcher naming
    /// itself among the dead fences nothing either.
    #[tokio::test]
    async fn a_restarted_dispatchers_previous_sessions_are_reported_without_fencing_its_new_one() {
        let e = Endings::default();
        e.opened("d1", "old");
        e.ended("d1", "old");
        let new = e.opened("d1", "new");
        let changes = e.report_changes();
        e.named_dead("d1", &["d1".to_owned()], false);
        assert!(!new.is_cancelled() && e.reports().is_empty());
        e.named_dead("d1", &[], true);
        assert!(!new.is_cancelled(), "the new process's session goes on");
        assert!(changes.has_changed().unwrap(), "reported at once");
        let reports = e.reports();
        assert_eq!(
            reports
                .iter()
                .map(|r| (r.dispatcher_id.as_str(), r.session_id.as_str()))
                .collect::<Vec<_>>(),
            [("d1", "old")]
        );
        // Its wait is over: nothing more to report.
        e.named_dead("d1", &[], false);
        assert!(e.reports().is_empty());
    }

    /// Naming lasts only while the session that heard it is open.
    #[tokio::test]
    async fn what_a_session_heard_is_forgotten_when_it_ends() {
        let e = Endings::default();
        e.opened("d2", "s2");
        e.ended("d1", "s1");
        e.named_dead("d2", &["d1".to_owned()], false);
        assert_eq!(e.reports().len(), 1);
        e.ended("d2", "s2");
        assert!(e.reports().is_empty());
        // An answer of a session that is not open any more names nobody.
        e.named_dead("d2", &["d1".to_owned()], false);
        assert!(e.reports().is_empty());
    }

    #[tokio::test]
    async fn what_is_remembered_is_bounded() {
        let e = Endings::default();
        for i in 0..=MAX_KEPT {
            e.ended(&format!("d{i}"), "s");
        }
        for n in 0..=ENDED_PER_DISPATCHER {
            e.ended("d0", &format!("s{n}"));
        }
        e.opened("live", "x");
        let names: Vec<String> = (0..=MAX_KEPT).map(|i| format!("d{i}")).collect();
        e.named_dead("live", &names, false);
        let inner = e.inner();
        assert_eq!(inner.ended.len(), MAX_KEPT);
        assert!(
            inner
                .ended
                .values()
                .all(|s| s.len() <= ENDED_PER_DISPATCHER)
        );
        assert!(inner.named.values().all(|ids| ids.len() <= MAX_KEPT));
        drop(inner);
        assert_eq!(e.reports().len(), MAX_REPORTS_PER_POLL);
        // More to report than one poll takes: every one goes out within a few polls.
        let reportable: usize = {
            let inner = e.inner();
            inner
                .ended
                .iter()
                .filter(|(id, _)| inner.is_dead(id))
                .map(|(_, sessions)| sessions.len())
                .sum()
        };
        assert!(reportable > 3 * MAX_REPORTS_PER_POLL, "{reportable}");
        let mut seen = HashSet::new();
        for _ in 0..reportable.div_ceil(MAX_REPORTS_PER_POLL) {
            seen.extend(
                e.reports()
                    .into_iter()
                    .map(|r| r.session_id + "@" + &r.dispatcher_id),
            );
        }
        assert_eq!(seen.len(), reportable);
    }
}
