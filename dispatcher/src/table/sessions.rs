//! A session's calls, from open to close, and its expiry. A session lives in its group
//! ([`Group::session`], beside the queue's half of it); the table only finds the group from the
//! id the wire gives, and checks that the caller opened it.

use std::{
    collections::HashMap,
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use kube_dispatch_core::{
    ack::Acked,
    children::OwnerChildren,
    queue::{Delivery, SessionId},
    subscription::GroupSpec,
};
use kube_dispatch_proto::lease::session_tag;
use kube_dispatch_server::auth::{Caller, GroupId};
use tokio::time::Instant;
use tracing::{debug, info};

use super::{GroupTable, SessionError, SessionRef};
use crate::group::{Ended, Group, SessionSlot, Taken};

/// The client of a session being opened, as its OpenSession names it.
#[derive(Clone, Copy, Debug)]
pub struct Client<'a> {
    /// The SDK and its version, for the logs.
    pub name: &'a str,
    /// Whether it takes its owners' children's bodies (the capability `children-bodies`): the
    /// group keeps them from before its watches list ([`Group::take_children_bodies`]).
    pub children_bodies: bool,
}

/// A session just opened.
#[derive(Debug)]
pub struct Opened {
    /// Its id on the wire.
    pub session_id: String,
    /// Its group.
    pub group: Arc<Group>,
    /// Whether the group was created for it (its watches were just started).
    pub created: bool,
}

/// What a poll returns.
#[derive(Debug)]
pub struct Polled {
    /// The session's group.
    pub group: Arc<Group>,
    /// The keys handed out, each owner with its children (`None` for keys of a kind no owned
    /// subscription maps to).
    pub deliveries: Vec<(Delivery, Option<OwnerChildren>)>,
    /// How long the dispatcher held the poll before its last look at the queue: the replica
    /// counts its deadlines from that long after it sent the poll (`controller-sdk` fencing).
    pub held: Duration,
    /// The dispatchers named dead, as the answer names them (recorded as told the session).
    pub named: crate::membership::sessions::Named,
}

impl GroupTable {
    /// Closes every session, releasing in-flight keys; used when draining.
    pub fn close_all(&self) {
        let sessions: Vec<(String, SessionRef)> = self.sessions().drain().collect();
        let now = std::time::Instant::now();
        for (wire_id, s) in sessions {
            let idle = s.group.remove_session(s.id);
            self.lease_sessions.ended(&wire_id, now, idle);
        }
    }

    /// Whether a new session of `replica` in `group` may be opened: not while draining, and
    /// not past `--max-sessions` (a replica reopening replaces its session and takes no new
    /// slot). Cheap: checked before the request's resources are resolved.
    pub fn admits(&self, group: &GroupId, replica: &str) -> Result<(), SessionError> {
        if self.shutdown.is_cancelled() {
            return Err(SessionError::Draining);
        }
        let replacing = self
            .groups()
            .get(group)
            .is_some_and(|e| e.group.has_replica(replica));
        self.settings
            .limits
            .quotas()
            .session(self.session_count(), replacing)
            .map_err(|e| self.refusal(e, group, None))
    }

    /// Opens a session of `replica` (running `client`) in `group`, which subscribes to `spec`, with `ttl`: joins the group, or creates it
    /// and starts its watches (waiting for their first list). A session the replica had in the
    /// group is replaced.
    pub async fn open(
        &self,
        group: &GroupId,
        replica: &str,
        client: Client<'_>,
        spec: &GroupSpec,
        ttl: Duration,
        caller: &Caller,
    ) -> Result<Opened, SessionError> {
        self.admits(group, replica)?;
        let (group, created) = self.group_for(group, replica, spec, caller)?;
        if client.children_bodies {
            group.take_children_bodies();
        }
        if created {
            self.subscribe_all(&group).await?;
        }
        let id = self.next_session.fetch_add(1, Ordering::Relaxed);
        let session_id = format!(
            "{}-{id}-{:016x}",
            self.settings.identity,
            rand::random::<u64>()
        );
        let user = caller.identity().map(|i| i.username.as_str());
        // Read before the open's answer names the dead: a change after it is new to the session.
        let told_dead = self.lease_sessions.named_dead().generation;
        let (slot, replaced) = group
            .add_session(id, session_id.clone(), replica, ttl, user)
            .map_err(|holder| SessionError::ReplicaOfAnother {
                group: group.id.name.clone(),
                replica: replica.to_owned(),
                holder,
                caller: caller.name().to_owned(),
            })?;
        slot.told_dead.store(told_dead, Ordering::Release);
        let mut sessions = self.sessions();
        // Listed before anything can hand it keys: it is in no index yet.
        self.lease_sessions.opened(&session_id);
        for old in replaced {
            let wire_id = &old.slot.wire_id;
            info!(session = %wire_id, %replica, "session replaced by a newer one of its replica");
            sessions.remove(wire_id);
            self.lease_sessions
                .ended(wire_id, std::time::Instant::now(), old.idle);
        }
        sessions.insert(
            session_id.clone(),
            SessionRef {
                group: group.clone(),
                id,
                opener: user.map(str::to_owned),
            },
        );
        drop(sessions);
        info!(session = %session_id, group = %group.id, %replica, client = client.name, ?ttl, "session opened");
        Ok(Opened {
            session_id,
            group,
            created,
        })
    }

    /// Settles `acks` of `session`, then hands it up to `max` ready keys, waiting up to `wait`
    /// (never past half its ttl, since a waiting poll does not renew it) for one. While
    /// draining, nothing new is handed out; the poll waits as usual, so replicas do not spin.
    pub async fn poll(
        &self,
        session: &str,
        caller: &Caller,
        acks: Vec<Acked>,
        wait: Duration,
        max: usize,
        max_bytes: usize,
    ) -> Result<Polled, SessionError> {
        let (group, id, slot) = self.lookup(session, caller)?;
        let received = Instant::now();
        renew(&slot);
        let wait = if slot.stopping.load(Ordering::Acquire) {
            Duration::ZERO
        } else {
            wait.min(slot.ttl / 2)
        };
        self.settle(&group, id, session, acks);
        let deadline = received + wait;
        // `looked` is when the last look at the queue began: the requests' reconcile time and
        // the renewal below both start no earlier.
        let mut looked = received;
        // A session is handed keys only once a Lease write lists it (`lease_sessions`): a new
        // one waits about a Lease round trip.
        let mut listed = self.lease_sessions.listed_changes();
        let tag = session_tag(session);
        let take = || {
            if self.draining.is_cancelled() || !self.lease_sessions.may_hand_out(tag) {
                Taken::default()
            } else {
                group.take_with_children(id, max, max_bytes)
            }
        };
        // A change of the slice may let the queue hand out what it holds (a handover's gate
        // opening): nothing else wakes the poll then, as the keys were ready already.
        // A fixed ring's slice never changes (its sender may be gone).
        let (mut slice, mut follow_slice) = (group.slice_changes(), true);
        // The dispatchers found dead that replicas are asked about: a change is answered at
        // once, so that a replica holding a session on one reports it without waiting. So is
        // one made since the session's last answer, before this poll began to watch: missed,
        // it left a restarted dispatcher waiting out its handover bound rather than its
        // previous sessions' reports.
        let mut dead = self.lease_sessions.dead_changes();
        let untold = dead.borrow_and_update().generation != slot.told_dead.load(Ordering::Acquire);
        // Once listed, a session stays listed until it ends: only a poll of a session not yet
        // listed follows the writes, so a write does not wake every poll of the dispatcher.
        let mut unlisted = !self.lease_sessions.may_hand_out(tag);
        let Taken {
            mut deliveries,
            mut look_again,
        } = take();
        while deliveries.is_empty() && !untold {
            // Owners left ready while their children are listed: nothing wakes the poll when
            // that list ends, so it looks again.
            let again = look_again.map_or(deadline, |at| deadline.min(at.into()));
            tokio::select! {
                () = slot.notify.notified() => {}
                () = tokio::time::sleep_until(again), if look_again.is_some() && again < deadline => {}
                changed = slice.changed(), if follow_slice => follow_slice = changed.is_ok(),
                Ok(()) = listed.changed(), if unlisted => {
                    unlisted = !self.lease_sessions.may_hand_out(tag);
                }
                Ok(()) = dead.changed() => break,
                () = tokio::time::sleep_until(deadline) => break,
                () = self.shutdown.cancelled() => break,
            }
            if !group.has_session(id) {
                return Err(SessionError::EndedWhilePolling {
                    session: session.to_owned(),
                });
            }
            looked = Instant::now();
            Taken {
                deliveries,
                look_again,
            } = take();
            if slot.stopping.load(Ordering::Acquire) {
                break;
            }
        }
        if deliveries.is_empty() {
            looked = Instant::now();
        }
        renew(&slot);
        let named = dead.borrow().clone();
        slot.told_dead.store(named.generation, Ordering::Release);
        Ok(Polled {
            group,
            deliveries,
            held: looked.duration_since(received),
            named,
        })
    }

    /// Settles `acks` of `session`, which renews it. `stopping`: its replica is stopping, so
    /// its poll held now is answered at once, and its later polls are not held.
    pub fn ack(
        &self,
        session: &str,
        caller: &Caller,
        acks: Vec<Acked>,
        stopping: bool,
    ) -> Result<(), SessionError> {
        let (group, id, slot) = self.lookup(session, caller)?;
        renew(&slot);
        self.settle(&group, id, session, acks);
        if stopping && !slot.stopping.swap(true, Ordering::AcqRel) {
            debug!(%session, "the replica is stopping: its polls are answered at once");
            slot.notify.notify_one();
        }
        Ok(())
    }

    /// Closes `session`: what it has in flight goes to the group's other sessions at once.
    /// Returns, when it closed with nothing in flight and the Lease may still list it, what to
    /// pass to [`crate::membership::sessions::LeaseSessions::unlisted`] to wait until it lists it
    /// no more.
    pub fn close(&self, session: &str, caller: &Caller) -> Result<Option<u64>, SessionError> {
        let mut sessions = self.sessions();
        let Some(s) = sessions.get(session) else {
            return Err(SessionError::NotOpen {
                session: session.to_owned(),
            });
        };
        check_opener(s, session, caller)?;
        let Some(s) = sessions.remove(session) else {
            return Err(SessionError::NotOpen {
                session: session.to_owned(),
            });
        };
        drop(sessions);
        info!(%session, group = %s.group.id, "session closed: its queued keys go to the others now, what it has in flight once it would have expired");
        let idle = s.group.close_session(s.id);
        Ok(self
            .lease_sessions
            .ended(session, std::time::Instant::now(), idle))
    }

    /// The group of `session` if `caller` opened it, to check access before a poll.
    pub fn group_of(&self, session: &str, caller: &Caller) -> Result<Arc<Group>, SessionError> {
        Ok(self.lookup(session, caller)?.0)
    }

    fn lookup(
        &self,
        session: &str,
        caller: &Caller,
    ) -> Result<(Arc<Group>, SessionId, Arc<SessionSlot>), SessionError> {
        let mut sessions = self.sessions();
        let Some(s) = sessions.get(session) else {
            return Err(SessionError::Unknown {
                session: session.to_owned(),
                identity: self.settings.identity.clone(),
            });
        };
        check_opener(s, session, caller)?;
        let Some(slot) = s.group.session(s.id) else {
            // Replaced by a newer session of the same replica.
            sessions.remove(session);
            return Err(SessionError::Replaced {
                session: session.to_owned(),
            });
        };
        Ok((s.group.clone(), s.id, slot))
    }

    /// Settles acks of a session; those not in flight are ignored, counted and logged.
    fn settle(&self, group: &Group, id: SessionId, session: &str, acks: Vec<Acked>) {
        if acks.is_empty() {
            return;
        }
        let unknown = group.ack(id, acks);
        if unknown > 0 {
            self.counters
                .unknown_acks
                .fetch_add(unknown as u64, Ordering::Relaxed);
            debug!(
                session,
                unknown, "acks of deliveries not in flight were ignored"
            );
        }
    }

    /// Expires the sessions not renewed by `now`: their in-flight keys go to the group's other
    /// sessions.
    pub(crate) fn expire_sessions(&self, now: Instant) {
        let mut expired = Vec::new();
        {
            // Every group a session leads to, including one the table no longer holds (a group
            // whose watch failed while a second session joined it, say): its sessions expire
            // too, or they would hold a slot of `--max-sessions` for good. Under the index's
            // lock, so an expired session is unknown at once, not taken for a replaced one.
            let mut sessions = self.sessions();
            let groups: HashMap<*const Group, Arc<Group>> = sessions
                .values()
                .map(|s| (Arc::as_ptr(&s.group), s.group.clone()))
                .collect();
            for group in groups.into_values() {
                for ended in group.expire_sessions(now) {
                    sessions.remove(&ended.slot.wire_id);
                    expired.push((group.clone(), ended));
                }
            }
        }
        for (group, Ended { slot, idle }) in expired {
            self.lease_sessions
                .ended(&slot.wire_id, std::time::Instant::now(), idle);
            self.counters
                .expired_sessions
                .fetch_add(1, Ordering::Relaxed);
            info!(session = %slot.wire_id, group = %group.id, replica = %slot.replica, "session expired: its in-flight keys go to other sessions");
        }
    }
}

/// Extends a session by its ttl.
fn renew(slot: &SessionSlot) {
    *slot.expires_at.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now() + slot.ttl;
}

/// Ok if `caller` opened `session` (or nobody is authenticated).
fn check_opener(s: &SessionRef, session: &str, caller: &Caller) -> Result<(), SessionError> {
    match (&s.opener, caller.identity()) {
        (None, _) => Ok(()),
        (Some(opener), Some(c)) if *opener == c.username => Ok(()),
        (Some(_), _) => Err(SessionError::NotYours {
            session: session.to_owned(),
            caller: caller.name().to_owned(),
        }),
    }
}
