//! Which keys this dispatcher may hand out while the ring changes: the gate of `HANDOVER.md`,
//! as pure logic over what the membership task observes (no I/O, time passed in).
//!
//! A dispatcher serves a key when it owns the key on its current ring *and* owned it on its
//! settled ring, the ring of the last completed handover. A key that moved in is held until
//! every other member has released the current ring (a Lease annotation written after this
//! dispatcher adopted the ring, so a release left over from an earlier change never counts),
//! every member that died has been gone for the bound `T` (or every session it listed on its
//! Lease is reported ended), and, when this dispatcher's own previous process died, `T` has
//! passed since it started (or every session that process listed is reported ended).

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use kube_dispatch_proto::{RequestKey, Ring, RingKey, capabilities, lease::ring_id};

use crate::{
    key::KeyRef,
    leases::{Observations, Peer, addresses, listing},
};
use tracing::info;

mod growth;
use growth::{Keeping, Stretches};

/// The keys a dispatcher serves.
#[derive(Clone, Debug)]
pub struct Slice {
    identity: Arc<str>,
    /// The ring as this dispatcher sees it.
    pub ring: Arc<Ring>,
    /// The ring of the last completed handover; `None` while nothing may be handed out
    /// (starting, draining, or cut off from the API server).
    pub settled: Option<Arc<Ring>>,
    /// The other live members that say where they serve: identity to `host:port`.
    pub peers: Arc<BTreeMap<String, String>>,
    /// Those of `peers` whose Lease lists the tier capability `peer-lists`: they make one LIST
    /// for the peers that need the same (`Peer.List`).
    pub list_sharers: Arc<BTreeSet<String>>,
    /// Until when this dispatcher's own Lease lets it hand out keys, moved forward by each
    /// renewal without publishing a new slice.
    pub lease: Arc<LeaseDeadline>,
    /// Its number, and what the groups kept up with before it ([`Slice::kept_since`]).
    keeping: Keeping,
}

/// Until when a dispatcher may hand out keys: its last renewal the API server accepted (counted
/// from when the request was sent) plus the Lease's duration. Past it, the others may count the
/// dispatcher gone and take its keys over once its reconciles are over, so it hands out nothing,
/// whatever slice it last published.
///
/// The membership loop also fences the dispatcher when the deadline passes, but only when it
/// runs: a process paused longer than its Lease (a frozen node, a stopped container, a long
/// stall) resumes with every task ready at once, and a poll may be answered before that loop
/// has looked at the clock. Checked where keys are handed out, the deadline closes that gap.
/// Shared between threads; one atomic load to check.
#[derive(Debug)]
pub struct LeaseDeadline {
    origin: Instant,
    /// Nanoseconds after `origin`; [`u64::MAX`] when there is no Lease (a fixed ring).
    until: AtomicU64,
}

impl LeaseDeadline {
    /// No Lease: keys may be handed out at any time.
    pub fn unlimited() -> Self {
        Self {
            origin: Instant::now(),
            until: AtomicU64::new(u64::MAX),
        }
    }

    /// A Lease not renewed yet: nothing may be handed out until [`LeaseDeadline::extend_to`].
    pub fn expired(origin: Instant) -> Self {
        Self {
            origin,
            until: AtomicU64::new(0),
        }
    }

    /// A renewal was accepted: keys may be handed out until `until` (never moved back).
    /// Returns the deadline before it (`None` with no Lease): one already past means the
    /// renewal came after the Lease had run out, and slices that handed out nothing hand out
    /// again, though no new slice was published.
    pub fn extend_to(&self, until: Instant) -> Option<Instant> {
        let nanos = until.saturating_duration_since(self.origin).as_nanos();
        let nanos = u64::try_from(nanos).unwrap_or(u64::MAX - 1);
        let before = self.until.fetch_max(nanos, Ordering::AcqRel);
        (before != u64::MAX).then(|| self.origin + Duration::from_nanos(before))
    }

    /// Whether keys may be handed out at `now`.
    pub fn allows(&self, now: Instant) -> bool {
        let until = self.until.load(Ordering::Acquire);
        until == u64::MAX
            || u64::try_from(now.saturating_duration_since(self.origin).as_nanos())
                .is_ok_and(|at| at < until)
    }
}

impl Slice {
    /// A slice that never changes: `ring` is fixed and fully handed over.
    pub fn fixed(identity: &str, ring: Ring) -> Self {
        let ring = Arc::new(ring);
        Self {
            identity: identity.into(),
            peers: Arc::default(),
            list_sharers: Arc::default(),
            settled: Some(ring.clone()),
            ring,
            lease: Arc::new(LeaseDeadline::unlimited()),
            keeping: Keeping::default(),
        }
    }

    /// Whether keys may be handed out at `now`: the handover of the ring completed (a
    /// settled ring) and this dispatcher's Lease is current ([`LeaseDeadline`]).
    pub fn hands_out(&self, now: Instant) -> bool {
        self.settled.is_some() && self.lease.allows(now)
    }

    /// The same ring with nothing served, for draining.
    pub fn closed(&self) -> Self {
        Self {
            settled: None,
            keeping: Keeping::default(),
            ..self.clone()
        }
    }

    /// Whether this dispatcher owns the placement hash ([`Ring::place`]) on its current ring.
    pub fn owns_hash(&self, placement: u64) -> bool {
        self.ring.owner_of_hash(placement) == Some(&*self.identity)
    }

    /// Whether this dispatcher owns the key, given as its wire string, on its current ring.
    pub fn owns_str(&self, key: &str) -> bool {
        self.owns_hash(self.ring.place(key))
    }

    /// Whether this dispatcher owns the key on its current ring.
    pub fn owns_key(&self, key: KeyRef<'_>) -> bool {
        self.owns_hash(self.placement(key))
    }

    /// Whether this dispatcher owns the placement hash on its settled ring.
    fn settled_owns_hash(&self, placement: u64) -> bool {
        self.settled
            .as_ref()
            .is_some_and(|s| s.owner_of_hash(placement) == Some(&*self.identity))
    }

    /// Whether this dispatcher serves the placement hash now.
    pub fn serves_hash(&self, placement: u64) -> bool {
        self.owns_hash(placement) && self.settled_owns_hash(placement)
    }

    /// Whether this dispatcher serves the request key now.
    pub fn serves(&self, key: &RequestKey) -> bool {
        self.serves_hash(self.ring.key().place_key(key))
    }

    /// Whether this dispatcher serves the key, given as its wire string.
    pub fn serves_str(&self, key: &str) -> bool {
        self.serves_hash(self.ring.place(key))
    }

    /// Whether this dispatcher serves the key now.
    pub fn serves_key(&self, key: KeyRef<'_>) -> bool {
        self.serves_hash(self.placement(key))
    }

    /// Where the key sits on this slice's ring.
    pub fn placement(&self, key: KeyRef<'_>) -> u64 {
        self.ring.key().place_hashed(key.text(), key.hash())
    }

    /// The API server's `shardSelector` for the keys this dispatcher owns on its current ring:
    /// `None` on a ring keyed by name, or when it owns all or none of them.
    pub fn shard_selector(&self) -> Option<String> {
        self.ring.shard_selector(&self.identity)
    }

    /// Whether this dispatcher is on the ring it sees.
    pub fn is_member(&self) -> bool {
        self.ring.contains(&self.identity)
    }

    /// Whether another member owns `key`: of its events, only a deletion matters here, kept in
    /// case the key moves to this dispatcher ([`crate::transit::GroupEvent::ExistsElsewhere`]).
    /// A dispatcher off its own ring owns nothing but keeps its index, so this is false there.
    pub fn owned_elsewhere(&self, key: KeyRef<'_>) -> bool {
        self.is_member() && !self.owns_key(key)
    }

    /// Whether this dispatcher may deliver `key`, now or until a handover completes: it owns
    /// it on its ring or on its settled ring (or it is off its own ring, where it owns nothing
    /// but keeps its index). What an index of keys served here keeps, and drops once this
    /// turns false ([`crate::children::Children::retain_owners`]); the union only grows
    /// when [`Self::may_serve_more_than`] says so, and a list then shows what it missed.
    pub fn may_serve(&self, key: KeyRef<'_>) -> bool {
        let placement = self.placement(key);
        !self.is_member() || self.owns_hash(placement) || self.settled_owns_hash(placement)
    }

    /// Whether `other` places keys as this slice does: the same ring and settled ring (by
    /// their members and ring key), whatever its peers and Lease.
    pub fn same_placement(&self, other: &Slice) -> bool {
        let same = |a: &Ring, b: &Ring| a.key() == b.key() && a.members() == b.members();
        self.identity == other.identity
            && same(&self.ring, &other.ring)
            && match (&self.settled, &other.settled) {
                (Some(a), Some(b)) => same(a, b),
                (None, None) => true,
                _ => false,
            }
    }

    /// The ring this dispatcher's queues let it publish as released: its ring, when it is on
    /// it and no controller group still holds a key that moved away, queued or in flight.
    /// `moving` answers that per group (`Transit::trim`, which first trims the group's
    /// queue to this slice); every group is asked, even once one says yes, so that each is
    /// trimmed. The handover gate may still withhold it ([`Handover::releasable`]).
    pub fn released(&self, moving: impl IntoIterator<Item = bool>) -> Option<String> {
        let moving = moving.into_iter().fold(false, |any, group| any | group);
        (!moving && self.is_member()).then(|| ring_id(&self.ring))
    }

    /// Whether every key this dispatcher owns is served (no handover pending).
    pub fn is_settled(&self) -> bool {
        self.settled
            .as_ref()
            .is_some_and(|s| s.members() == self.ring.members())
    }
}

/// Whether `peer`'s Lease carries a release of ring `id` that counts for a dispatcher that
/// adopted the ring when the newest Lease resourceVersion it had seen was `adopted_at`: written
/// after that, by a holder that had seen every Lease write the adopter had then.
fn release_counts(peer: &Peer, id: &str, adopted_at: u128) -> bool {
    peer.released.as_deref() == Some(id)
        && peer.resource_version > adopted_at
        && peer.released_after >= adopted_at
}

/// A member that stopped renewing without releasing.
#[derive(Debug)]
struct Died {
    /// When that was noticed: its reconciles are waited out until the bound has passed since.
    at: Instant,
    /// The sessions its Lease listed (every session it may have handed keys to), when known:
    /// once each is reported ended, nothing it handed out runs any more, and the wait ends
    /// before the bound.
    sessions: Option<BTreeSet<u64>>,
}

/// The handover gate of one dispatcher.
#[derive(Debug)]
pub struct Handover {
    identity: String,
    bound: Duration,
    ring_key: RingKey,
    ring: Arc<Ring>,
    /// The newest Lease resourceVersion seen when the current ring was adopted: releases must
    /// come from later writes.
    adopted_at: u128,
    settled: Option<Arc<Ring>>,
    /// Members that stopped renewing without releasing; this dispatcher's own identity while
    /// it waits out its previous process, which died.
    died: HashMap<String, Died>,
    /// Until when this dispatcher's Lease is current, shared with every slice it publishes.
    lease: Arc<LeaseDeadline>,
    /// Numbers the slices, and follows the stretches in which it handed nothing out.
    stretches: Stretches,
}

impl Handover {
    /// The gate of dispatcher `identity`, started at `now`; `bound` is `T`, the longest a
    /// reconcile started from a lost dispatcher can still run. When `predecessor_died`, this
    /// identity's Lease was found unreleased at start, so its previous process may have left
    /// reconciles running: nothing is handed out, and no ring released, until `bound` has
    /// passed, or every session that process listed is reported ended
    /// ([`Handover::predecessor_listed`]), as for any member that died.
    pub fn new(identity: &str, bound: Duration, now: Instant, predecessor_died: bool) -> Self {
        let previous = Died {
            at: now,
            sessions: None,
        };
        let died = predecessor_died.then(|| (identity.to_owned(), previous));
        Self {
            identity: identity.to_owned(),
            bound,
            ring_key: RingKey::Name,
            ring: Arc::new(Ring::new(Vec::<String>::new())),
            adopted_at: 0,
            settled: None,
            died: died.into_iter().collect(),
            lease: Arc::new(LeaseDeadline::expired(now)),
            stretches: Stretches::default(),
        }
    }

    /// The sessions the unreleased Lease of this dispatcher's previous process listed, as found
    /// at start (`None`: unknown, as when that process itself waited out its own predecessor):
    /// once each is reported ended, that process handed out nothing that still runs, and the
    /// wait for it ends before the bound. Nothing changes when no previous process died.
    pub fn predecessor_listed(mut self, sessions: Option<BTreeSet<u64>>) -> Self {
        if let Some(died) = self.died.get_mut(&self.identity) {
            died.sessions = sessions;
        }
        self
    }

    /// A renewal of this dispatcher's Lease was accepted: its slices hand out keys until
    /// `until` (the renewal's send time plus the Lease duration) at most. Returns the deadline
    /// before it ([`LeaseDeadline::extend_to`]): if that had passed, whoever waits on the
    /// slices must be told that they hand out again.
    pub fn renewed(&self, until: Instant) -> Option<Instant> {
        self.lease.extend_to(until)
    }

    /// The same gate over rings that place keys by `key`.
    pub fn with_ring_key(mut self, key: RingKey) -> Self {
        self.ring_key = key;
        self.ring = Arc::new(Ring::with_key(Vec::<String>::new(), key));
        self
    }

    /// Records that `member` stopped renewing its Lease without releasing it, noticed at `now`:
    /// its reconciles are waited out for the bound.
    pub fn died(&mut self, member: &str, now: Instant) {
        self.died_with(member, now, None);
    }

    /// As [`Handover::died`], knowing the sessions the member may have handed keys to (`None`:
    /// unknown): the wait ends early once each is reported ended. A member still waited out (a
    /// process of it died, a new one died too within the bound) is waited out for both: the
    /// bound from the later death, the sessions of both (unknown if either's are).
    fn died_with(&mut self, member: &str, now: Instant, sessions: Option<BTreeSet<u64>>) {
        let died = match self.died.remove(member) {
            Some(before) if now < before.at + self.bound => Died {
                at: now.max(before.at),
                sessions: before.sessions.zip(sessions).map(|(mut a, b)| {
                    a.extend(b);
                    a
                }),
            },
            _ => Died { at: now, sessions },
        };
        self.died.insert(member.to_owned(), died);
    }

    /// Judges membership on a whole and current view of the Leases (`observations` at `now`;
    /// a member is live while its Lease changed within its duration plus `grace`). Returns the
    /// live members, and each member of the ring adopted so far that is live no more, with
    /// whether it died: its Lease is still known (expired, or deleted without the drained mark),
    /// so the reconciles it handed out are waited out ([`Handover::died`]). One not known (or
    /// known again only warming up, [`Observations::take_releases`]) drained: a clean release,
    /// unless a re-list came since. A member whose Lease was deleted without the drained mark
    /// since the last judgement died too, even if live again (a new process of it renews): the
    /// reconciles of the old one are waited out all the same.
    pub fn judge(
        &mut self,
        observations: &mut Observations,
        grace: Duration,
        now: Instant,
    ) -> (BTreeMap<String, Peer>, Vec<(String, bool)>) {
        let deaths = observations.take_deaths();
        let releases = observations.take_releases();
        let mut live = observations.live(now, grace);
        // A dispatcher warming up to join is no member yet: the others keep serving what will
        // move to it until it has listed it (`WARMING_ANNOTATION`). This one counts itself.
        live.retain(|member, peer| !peer.warming || *member == self.identity);
        for member in deaths.iter().filter(|m| live.contains_key(*m)) {
            // Still gone, it is counted below or was at its expiry (not the collector's delete).
            info!(%member, "a dispatcher's Lease was deleted without the drained mark and written again: waiting out the reconciles of its previous process");
            self.died(member, now);
        }
        // Released, even if a new process warming up wrote it since; died if deleted without
        // the mark since the last judgement, whatever came after (its Lease then lists others').
        let died =
            |m: &String| deaths.contains(m) || observations.knows(m) && !releases.contains(m);
        let gone: Vec<(String, bool)> = self
            .ring
            .members()
            .iter()
            .filter(|m| !live.contains_key(*m))
            .map(|m| (m.clone(), died(m)))
            .collect();
        for (member, _) in gone.iter().filter(|(_, died)| *died) {
            let sessions = observations
                .published_sessions(member)
                .filter(|_| !deaths.contains(member));
            self.died_with(member, now, sessions.cloned());
        }
        self.died.retain(|member, died| {
            let ended = died
                .sessions
                .as_ref()
                .is_some_and(|tags| observations.all_ended(member, tags));
            let sessions = died.sessions.as_ref().map_or(0, BTreeSet::len);
            if ended && *member == self.identity {
                info!(
                    sessions,
                    "every session this dispatcher's previous process may have handed keys to was reported ended: its keys are served without waiting out the bound"
                );
            } else if ended {
                info!(
                    %member,
                    sessions,
                    "every session the dispatcher that died may have handed keys to was reported ended: its keys are served without waiting out the bound"
                );
            }
            !ended
        });
        (live, gone)
    }

    /// What this dispatcher may write as its release at `now`: the ring its queues released
    /// (`queued`), unless it waits out a member that died ([`Handover::waits_on_dead`]).
    pub fn releasable(&self, queued: Option<String>, now: Instant) -> Option<String> {
        queued.filter(|_| !self.waits_on_dead(now))
    }

    /// The members that died whose sessions are known and that this dispatcher still waits
    /// for, each with the sessions its Lease listed: once each is reported ended, the wait
    /// ends ([`Handover::judge`]). Replicas holding one are asked to end it and report. This
    /// dispatcher's own identity among them stands for its previous process.
    pub fn awaited(&self) -> impl Iterator<Item = (&str, &BTreeSet<u64>)> {
        self.died
            .iter()
            .filter_map(|(member, d)| Some((member.as_str(), d.sessions.as_ref()?)))
    }

    /// Whether this dispatcher still waits out its own previous process, at `now` (it found
    /// its Lease unreleased at start), one of the waits of [`Handover::waits_on_dead`].
    pub fn holds_for_predecessor(&self, now: Instant) -> bool {
        self.died
            .get(&self.identity)
            .is_some_and(|d| now < d.at + self.bound)
    }

    /// Whether this dispatcher still waits out a member that died, or its own previous
    /// process, at `now`. While it does, it must release no ring: a dispatcher that joins
    /// meanwhile (a new member, or one restarted with a drained Lease) never saw the dead
    /// member (its Lease may be deleted) and waits only for the others' releases, so theirs
    /// must wait for the bound; and keys moving from here to it may still be reconciled from
    /// the previous process. Nor may its Lease list its sessions as all it may have handed keys
    /// to: were it to die too, one that never saw the death would otherwise end its wait for
    /// this dispatcher by reports, while the dead one's reconciles still run.
    pub fn waits_on_dead(&self, now: Instant) -> bool {
        self.died.values().any(|d| now < d.at + self.bound)
    }

    /// The slice to serve at `now`, given the live members, the newest Lease resourceVersion
    /// seen, and whether this dispatcher is fenced (could not renew its own Lease in time).
    pub fn update(
        &mut self,
        live: &BTreeMap<String, Peer>,
        newest: u128,
        fenced: bool,
        now: Instant,
    ) -> Slice {
        if self.ring.members().iter().ne(live.keys()) {
            self.ring = Arc::new(Ring::with_key(live.keys().cloned(), self.ring_key));
            self.adopted_at = newest;
            info!(members = ?self.ring.members(), ring = %ring_id(&self.ring), "adopted a new ring");
        }
        self.died.retain(|_, d| now < d.at + self.bound);
        if fenced || !self.ring.contains(&self.identity) {
            if self.settled.take().is_some() {
                info!(
                    fenced,
                    "handing out nothing: this dispatcher is not on the ring it sees, or cannot renew its Lease"
                );
            }
            // Releases seen so far may predate what the others did meanwhile.
            self.adopted_at = self.adopted_at.max(newest);
        } else if !self.is_settled() && self.gate_open(live) {
            info!(ring = %ring_id(&self.ring), "handover complete: serving every key this dispatcher owns");
            self.settled = Some(self.ring.clone());
        }
        let peers = addresses(live, &self.identity);
        Slice {
            identity: self.identity.as_str().into(),
            ring: self.ring.clone(),
            settled: self.settled.clone(),
            list_sharers: Arc::new(listing(&peers, live, capabilities::tier::PEER_LISTS)),
            peers: Arc::new(peers),
            lease: self.lease.clone(),
            keeping: self
                .stretches
                .next(&self.identity, &self.ring, self.settled.is_none()),
        }
    }

    fn is_settled(&self) -> bool {
        self.settled
            .as_ref()
            .is_some_and(|s| s.members() == self.ring.members())
    }

    fn gate_open(&self, live: &BTreeMap<String, Peer>) -> bool {
        if !self.died.is_empty() {
            return false;
        }
        let id = ring_id(&self.ring);
        live.iter()
            .filter(|(name, _)| **name != self.identity)
            .all(|(_, peer)| self.counts(peer, &id))
    }

    /// Whether `peer`'s release counts for the ring `id`: written after this dispatcher
    /// adopted the ring, by a holder that had seen every Lease write this dispatcher had then.
    fn counts(&self, peer: &Peer, id: &str) -> bool {
        release_counts(peer, id, self.adopted_at)
    }

    /// What this dispatcher waits for, to publish on its Lease: the ring it adopted and the
    /// newest Lease resourceVersion it had seen then, while it is on that ring and not settled
    /// on it (its gate is closed, or it is fenced). The others' releases count only if written
    /// after that resourceVersion ([`Handover::owed_release`] tells them to write again).
    pub fn awaits(&self) -> Option<(String, u128)> {
        (self.ring.contains(&self.identity) && !self.is_settled())
            .then(|| (ring_id(&self.ring), self.adopted_at))
    }

    /// Whether a live peer waits for a release of ring `released` that this dispatcher's last
    /// accepted Lease write (`written`, as the others see it) does not give it, by the rule the
    /// peer's gate applies (Fresh, `HANDOVER.md`): written no later than the peer adopted the
    /// ring, or by this dispatcher before it had seen all the peer had then, or of another
    /// ring. If so, the newest such adoption (the resourceVersion the peer had seen): this
    /// dispatcher should write its Lease again now, rather than on its next periodic renewal.
    /// The write that follows comes after the peer's and was made having seen it, so it counts,
    /// and this answers `None` again: one extra write per adoption of each peer.
    pub fn owed_release(
        &self,
        live: &BTreeMap<String, Peer>,
        released: Option<&str>,
        written: &Peer,
    ) -> Option<u128> {
        let released = released?;
        live.iter()
            .filter(|(name, _)| **name != self.identity)
            .filter_map(|(_, peer)| peer.awaits.as_ref())
            .filter(|(ring, adopted_at)| {
                ring == released && !release_counts(written, ring, *adopted_at)
            })
            .map(|(_, adopted_at)| *adopted_at)
            .max()
    }

    /// Why the gate is closed, for logs; `None` when every owned key is served.
    pub fn waiting_for(&self, live: &BTreeMap<String, Peer>) -> Option<String> {
        if self.is_settled() {
            return None;
        }
        let id = ring_id(&self.ring);
        let mut reasons = Vec::new();
        for (name, died) in &self.died {
            let ended = died.sessions.as_ref().map_or(String::new(), |s| {
                format!(" or its {} listed sessions to be reported ended", s.len())
            });
            let who = match *name == self.identity {
                true => "this dispatcher's previous process (died)".to_owned(),
                false => format!("{name} (died)"),
            };
            reasons.push(format!("{who} to be gone for {:?}{ended}", self.bound));
        }
        for (name, peer) in live {
            if *name != self.identity && !self.counts(peer, &id) {
                reasons.push(format!("{name} to release ring {id}"));
            }
        }
        Some(reasons.join(", "))
    }
}

#[cfg(test)]
mod tests;
