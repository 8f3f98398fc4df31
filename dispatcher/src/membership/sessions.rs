//! What the dispatcher's Lease says of sessions, shared between the group table (sessions
//! opened, ended and polled; reports of ended sessions received from replicas) and the
//! membership loop (which writes the Lease and judges the others'): `dispatcher/HANDOVER.md`,
//! "Ending the wait for a member that died, by reports".
//!
//! - A session is handed keys only once a Lease write listing it was accepted
//!   ([`LeaseSessions::may_hand_out`]); opening one asks the membership loop for a write
//!   ([`LeaseSessions::write_wanted`]), made at once unless one was made for sessions in the
//!   last [`super::SESSION_WRITE_SPACING`] (200 ms): a new session waits a Lease round trip, and
//!   at most that long more in a storm of opens, which the Lease takes in a few writes a second.
//!   A listed session that ends with nothing in flight asks for a write the same way, so that
//!   the Lease stops listing it: its replica would never be asked to report it.
//! - Replicas report the sessions they held on a dispatcher that died; the membership loop
//!   takes the reports ([`LeaseSessions::take_reports`]), keeps those of sessions the dead
//!   member listed, and carries them on the Lease.
//! - The members whose sessions this dispatcher waits to see ended, and its own previous
//!   process when it waits for that one's, are told to every replica that polls
//!   ([`LeaseSessions::named_dead`]); a poll answers at once when they changed since its
//!   session's last answer (the change is recorded as told when the answer is built: a poll
//!   whose answer was lost on the way hears of it with the next change only).
//!
//! Bounds: the listing holds the sessions open (at most `--max-sessions`) and those ended
//! within the handover bound, at most twice
//! [`kube_dispatch_core::lease_sessions::MAX_LISTED_SESSIONS`] (past it the oldest ended ones are
//! forgotten and the Lease says `overflow` for the bound), and writes `overflow` past
//! `MAX_LISTED_SESSIONS`; at most [`MAX_PENDING_REPORTS`] reports wait for the membership loop
//! (it takes them every 100 ms), and the Lease carries at most
//! [`kube_dispatch_core::lease_sessions::MAX_RELAYED`]; the dead members are at most the ring's.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{Arc, Mutex, MutexGuard},
    time::Instant,
};

use kube_dispatch_core::lease_sessions::{ListedSessions, SessionsWrite};
use kube_dispatch_proto::lease::session_tag;
use tokio::sync::{Notify, watch};

/// Most reports of ended sessions waiting for the membership loop; past it, reports are
/// dropped (the replica sends them again with its next poll while the member is named dead).
pub const MAX_PENDING_REPORTS: usize = 256;

/// The sessions on this dispatcher's Lease, and the reports it carries.
#[derive(Debug)]
pub struct LeaseSessions {
    listing: Mutex<ListedSessions>,
    /// Moves each time an accepted write lists sessions: polls waiting to be handed keys look
    /// again.
    listed: watch::Sender<u64>,
    write: Notify,
    reports: Mutex<Vec<(String, u64)>>,
    /// The members named dead, each with the sessions it listed: a report of any other is
    /// dropped at once.
    dead: watch::Sender<Named>,
    /// The number of the last accepted write ([`SessionsWrite::number`]): a close waits for
    /// the write that lists its session no more.
    accepted: watch::Sender<u64>,
    /// The members named dead are as judged on a whole and current view of the Leases: false
    /// until the first such view, and while fenced (when none is named).
    judged: std::sync::atomic::AtomicBool,
}

/// Members that died, each with the sessions its Lease listed.
pub type Awaited = BTreeMap<String, BTreeSet<u64>>;

/// What became of a report of an ended session ([`LeaseSessions::report`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reported {
    /// Taken for the membership loop (or taken already).
    Taken,
    /// No member named dead listed that session: dropped.
    NotAwaited,
    /// [`MAX_PENDING_REPORTS`] wait already: dropped, to be sent again.
    Full,
}

/// The members named dead, and how many times that changed: a poll tells whether its
/// session's last answer named the ones named now.
#[derive(Clone, Debug, Default)]
pub struct Named {
    /// Moves with every change of `awaited`.
    pub generation: u64,
    /// The members named dead, each with the sessions it listed.
    pub awaited: Arc<Awaited>,
}

impl Named {
    /// What an answer of dispatcher `identity` names dead: the other members replicas are
    /// asked to report their sessions on (`dead_dispatchers`), and whether its own previous
    /// process is one (`previous_process_died`: named apart, since a replica would end its
    /// session with the new process on finding `identity` among the dead).
    pub fn for_replicas(&self, identity: &str) -> (Vec<String>, bool) {
        let others = self
            .awaited
            .keys()
            .filter(|m| *m != identity)
            .cloned()
            .collect();
        (others, self.awaited.contains_key(identity))
    }
}

impl LeaseSessions {
    /// Sessions that stay listed for `keep` (the handover bound) after they end.
    pub fn new(keep: std::time::Duration) -> Self {
        Self::with(ListedSessions::new(keep))
    }

    /// No Lease (a fixed ring): sessions are handed keys at once, and nobody dies.
    pub fn unlimited() -> Self {
        let sessions = Self::with(ListedSessions::unlimited());
        sessions
            .judged
            .store(true, std::sync::atomic::Ordering::Release);
        sessions
    }

    fn with(listing: ListedSessions) -> Self {
        Self {
            listing: Mutex::new(listing),
            listed: watch::channel(0).0,
            write: Notify::new(),
            reports: Mutex::new(Vec::new()),
            dead: watch::channel(Named::default()).0,
            accepted: watch::channel(0).0,
            judged: std::sync::atomic::AtomicBool::new(false),
        }
    }

    fn listed(&self) -> MutexGuard<'_, ListedSessions> {
        self.listing.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Session `session_id` was opened: the next Lease write lists it, and is asked for now.
    pub fn opened(&self, session_id: &str) {
        let mut listing = self.listed();
        listing.opened(session_tag(session_id));
        if listing.unwritten() {
            self.write.notify_one();
        }
    }

    /// Session `session_id` ended here at `now` (closed, expired, replaced, drained), `idle`
    /// when it had nothing in flight ([`ListedSessions::ended`]). Returns, when the Lease may
    /// still list it, what to pass to [`LeaseSessions::unlisted`].
    pub fn ended(&self, session_id: &str, now: Instant, idle: bool) -> Option<u64> {
        let mut listing = self.listed();
        let made = listing.ended(session_tag(session_id), now, idle);
        // One a write listed ended idle: the Lease should list it no more soon (spaced as the
        // writes for new sessions are).
        if listing.unwritten() {
            self.write.notify_one();
        }
        made
    }

    /// While session `session_id`, ended idle, may still be listed: what to pass to
    /// [`LeaseSessions::unlisted`] to wait until it is not.
    pub fn unlisting(&self, session_id: &str) -> Option<u64> {
        self.listed().unlisting(session_tag(session_id))
    }

    /// Resolves once a write made after `made` writes is accepted: it lists no session that
    /// had ended idle by then.
    pub async fn unlisted(&self, made: u64) {
        let _ = self.accepted.subscribe().wait_for(|n| *n > made).await;
    }

    /// Whether the session with tag `tag` ([`session_tag`] of its id) may be handed keys: an
    /// accepted Lease write lists it.
    pub fn may_hand_out(&self, tag: u64) -> bool {
        self.listed().may_hand_out(tag)
    }

    /// Changes each time an accepted write lists more sessions.
    pub fn listed_changes(&self) -> watch::Receiver<u64> {
        self.listed.subscribe()
    }

    /// Resolves when a session waits for a Lease write to list it, or one a write listed
    /// ended idle.
    pub async fn write_wanted(&self) {
        self.write.notified().await;
    }

    /// Whether a session waits for a Lease write to list it, or to list it no more (one made
    /// since it asked may have).
    pub fn unwritten(&self) -> bool {
        self.listed().unwritten()
    }

    /// What the next Lease write lists, at `now`.
    pub fn to_write(&self, now: Instant) -> SessionsWrite {
        self.listed().write(now)
    }

    /// The write made from `write` was accepted.
    pub fn written(&self, write: &SessionsWrite) {
        self.listed().written(write);
        self.listed.send_modify(|n| *n = write.through);
        self.accepted.send_if_modified(|n| {
            let newer = write.number > *n;
            *n = (*n).max(write.number);
            newer
        });
    }

    /// A replica reports that its session `session_id` on dispatcher `member` has ended. Kept
    /// for the membership loop only if `member` is named dead and listed that session: what
    /// a client sends cannot crowd out the reports that matter.
    pub fn report(&self, member: &str, session_id: &str) -> Reported {
        let tag = session_tag(session_id);
        let listed = self
            .dead
            .borrow()
            .awaited
            .get(member)
            .is_some_and(|tags| tags.contains(&tag));
        if !listed {
            return Reported::NotAwaited;
        }
        let mut reports = self.reports.lock().unwrap_or_else(|e| e.into_inner());
        if reports.iter().any(|(m, t)| *t == tag && m == member) {
            return Reported::Taken;
        }
        if reports.len() >= MAX_PENDING_REPORTS {
            return Reported::Full;
        }
        reports.push((member.to_owned(), tag));
        Reported::Taken
    }

    /// The reports received since the last call: each a member and a session tag.
    pub fn take_reports(&self) -> Vec<(String, u64)> {
        std::mem::take(&mut *self.reports.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// The members that died whose sessions this dispatcher waits to see ended, with the
    /// sessions each listed, as judged on a whole and current view of the Leases.
    pub fn judged_dead(&self, awaited: Awaited) {
        self.set_dead(awaited);
        self.judged
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// This dispatcher is fenced: it names nobody dead, and cannot carry reports.
    pub fn fenced(&self) {
        self.judged
            .store(false, std::sync::atomic::Ordering::Release);
        self.set_dead(Awaited::default());
    }

    /// Whether the members named dead are as judged now ([`LeaseSessions::judged_dead`]):
    /// otherwise (just started, or fenced) a report of a session of its own previous process
    /// cannot be told from another.
    pub fn judged(&self) -> bool {
        self.judged.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The members that died whose sessions this dispatcher waits to see ended, with the
    /// sessions each listed.
    pub fn set_dead(&self, awaited: Awaited) {
        self.dead.send_if_modified(|dead| {
            let changed = *dead.awaited != awaited;
            if changed {
                dead.awaited = Arc::new(awaited);
                dead.generation += 1;
            }
            changed
        });
    }

    /// The members named dead now ([`Named::for_replicas`] says what an answer carries).
    pub fn named_dead(&self) -> Named {
        self.dead.borrow().clone()
    }

    /// Changes with [`LeaseSessions::named_dead`].
    pub fn dead_changes(&self) -> watch::Receiver<Named> {
        self.dead.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use std::{pin::pin, time::Duration};

    use futures::FutureExt;

    use super::*;

    /// A close waits for [`LeaseSessions::unlisted`]: it resolves once a write made after the
    /// session ended idle is accepted, not with the write that may still list it.
    #[test]
    fn a_session_ended_idle_is_unlisted_once_a_later_write_is_accepted() {
        let now = Instant::now();
        let l = LeaseSessions::new(Duration::from_secs(10));
        l.opened("s1");
        l.opened("s2");
        let listing = l.to_write(now);
        let made = l
            .ended("s1", now, true)
            .expect("a write made lists it, accepted or not");
        assert_eq!(l.unlisting("s1"), Some(made));
        assert_eq!(l.unlisting("s2"), None, "not ended idle");
        assert_eq!(
            l.ended("s2", now, false),
            None,
            "in flight: listed for the bound"
        );
        let mut unlisted = pin!(l.unlisted(made));
        l.written(&listing);
        assert!(
            unlisted.as_mut().now_or_never().is_none(),
            "the write accepted lists it"
        );
        let next = l.to_write(now);
        l.written(&next);
        assert!(
            unlisted.now_or_never().is_some(),
            "the next lists it no more"
        );
        assert_eq!(l.unlisting("s1"), None);
    }

    /// A repeated close is taken as a report only once the Leases are judged and name the
    /// previous process dead with that session listed; a fixed ring has nothing to judge.
    #[test]
    fn a_report_is_taken_only_for_a_session_a_member_named_dead_listed() {
        let l = LeaseSessions::new(Duration::from_secs(10));
        assert!(!l.judged());
        assert_eq!(
            l.report("d0", "s9"),
            Reported::NotAwaited,
            "nobody named dead yet"
        );
        let mut listed: BTreeSet<u64> = [session_tag("s9")].into();
        listed.extend((0..MAX_PENDING_REPORTS).map(|i| session_tag(&format!("x{i}"))));
        l.judged_dead([("d0".to_owned(), listed)].into());
        assert!(l.judged());
        assert_eq!(l.report("d0", "s8"), Reported::NotAwaited, "not listed");
        assert_eq!(l.report("d1", "s9"), Reported::NotAwaited, "not named dead");
        assert_eq!(l.report("d0", "s9"), Reported::Taken);
        assert_eq!(
            l.report("d0", "s9"),
            Reported::Taken,
            "taken again, carried once"
        );
        assert_eq!(l.take_reports(), vec![("d0".to_owned(), session_tag("s9"))]);
        for i in 0..MAX_PENDING_REPORTS {
            assert_eq!(l.report("d0", &format!("x{i}")), Reported::Taken);
        }
        assert_eq!(l.report("d0", "s9"), Reported::Full, "to be sent again");
        l.fenced();
        assert!(!l.judged(), "fenced: names nobody, carries nothing");
        assert_eq!(l.report("d0", "x0"), Reported::NotAwaited);
        assert!(LeaseSessions::unlimited().judged());
    }
}
