//! Ring membership from coordination.k8s.io Leases, and the handover gate fed from them.
//!
//! Each dispatcher holds a Lease named after its identity and renews it, carrying the ring it
//! has released ([`kube_dispatch_proto::lease::RELEASED_ANNOTATION`]); every dispatcher computes
//! the ring from the Leases it sees renewed ([`kube_dispatch_server::leases::LeaseWatch`],
//! judged by [`kube_dispatch_core::leases`]), and from the releases decides which keys it may
//! hand out ([`kube_dispatch_core::handover`], `HANDOVER.md`). A dispatcher that cannot renew its own
//! Lease within the duration stops handing out keys (it is fenced) before the others can
//! consider it gone.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, Client};
use kube_dispatch_core::{
    handover::{Handover, Slice},
    lease_sessions::Relayed,
    leases::Peer,
};
use kube_dispatch_proto::{RingKey, capabilities};
use kube_dispatch_server::leases::{LeaseWatch, lease_state};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use kube_dispatch_telemetry::metrics::Metrics;
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family},
};

use crate::config::LeaseConfig;

mod judging;
mod lease;
pub mod sessions;
pub mod warm_up;
use sessions::LeaseSessions;
use warm_up::{WarmPeer, WarmUp};

/// Holds this dispatcher's Lease, computes the ring and the handover gate from the Leases, and
/// publishes what this dispatcher serves on `slice`, until `stop`. The ring the core has
/// released (`released`) is written on the Lease, and so are the sessions `sessions` lists and
/// the reports of ended sessions of members that died it received (`HANDOVER.md`, "Ending the
/// wait for a member that died, by reports"). After `stop`, the Lease is deleted (so the
/// others take over at once) only if `clean` is set, that is when nothing handed out is still in
/// flight; otherwise it is left to expire and the others wait out the handover bound. A
/// dispatcher that finds no Lease of its own joins after `warm` ends (`warm_up`); one whose
/// previous process left its Lease behind ends `warm` at once.
///
/// Each pass: renew when due (`Membership::renew`), judge the members on a whole and current
/// view of the Leases (`Membership::judge`), delete the Leases of members dead past the bound
/// (`Membership::collect_dead`), and publish the slice (`Membership::publish`).
#[allow(clippy::too_many_arguments)]
pub async fn run(
    client: Client,
    config: LeaseConfig,
    ring_key: RingKey,
    slice: watch::Sender<Arc<Slice>>,
    released: watch::Receiver<Option<String>>,
    sessions: Arc<LeaseSessions>,
    (stop, clean): (CancellationToken, Arc<AtomicBool>),
    lease_metrics: LeaseMetrics,
    warm: WarmUp,
) {
    let leases: Api<Lease> = Api::namespaced(client, &config.namespace);
    let mut m = Membership::start(
        leases,
        config,
        ring_key,
        slice,
        released,
        (sessions, lease_metrics, warm),
    )
    .await;
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    // When a write wanted for new sessions is due (`SessionWrites`).
    let mut session_write: Option<tokio::time::Instant> = None;
    let mut session_writes = SessionWrites::default();
    loop {
        // In this order: the Leases seen first (a storm of writes never leaves the view
        // behind), then renewals on the period and at once when the released ring changes,
        // then the writes new sessions wait for.
        let warming = m.warm.warming();
        // The warm-up ended while this loop was busy elsewhere: the mark goes at the next pass
        // all the same (once: a write that fails is retried on the period).
        let unmark = !warming && m.mark_sent;
        let renew_due = tokio::select! {
            biased;
            () = stop.cancelled() => break,
            more = m.lease_watch.next() => if more { false } else { break },
            _ = m.renew_tick.tick() => true,
            // Warmed up (or out of time): the mark goes at once, and the others adopt the ring.
            () = m.warm.ended(), if warming => true,
            () = tokio::time::sleep_until(m.warm.until()), if warming => {
                info!(lease = %m.config.identity, "the warm-up ran out: joining the ring");
                m.warm.end();
                true
            }
            Ok(()) = m.released.changed() => true,
            // A new session is handed keys once a write lists it.
            () = tokio::time::sleep_until(session_write.unwrap_or_else(tokio::time::Instant::now)), if session_write.is_some() => {
                session_writes.made(tokio::time::Instant::now());
                true
            }
            () = m.sessions.write_wanted(), if session_write.is_none() => {
                // A write made since the session asked (a renewal) may have listed it.
                if m.sessions.unwritten() {
                    session_write = Some(session_writes.due(tokio::time::Instant::now()));
                }
                false
            }
            _ = tick.tick() => false,
        } || unmark;
        m.fence_after_a_pause(Instant::now());
        if renew_due {
            // Whatever the cause, a write lists every session opened so far.
            session_write = None;
            m.renew(Instant::now()).await;
        }
        let now = Instant::now();
        let judged = m.judge(now);
        if judged && m.warm.warming() {
            m.warm.set_peers(m.warm_peers());
        }
        // Served from the first view that shows the write without the mark (a judged view
        // shows this dispatcher's last accepted write): an older one may still show a peer
        // that unmarked before it as warming, and leave it out of the ring.
        if judged && m.unmark_accepted {
            m.mark_accepted = false;
        }
        m.collect_dead(now).await;
        m.publish(now, judged);
    }
    if !clean.load(Ordering::Acquire) {
        warn!(lease = %m.config.identity, "leaving the Lease to expire: reconciles were still in flight");
        return;
    }
    // Nothing of its own is in flight, but its previous process's reconciles, or those of a
    // member that died, may still run: a release would let the others (one that joined since,
    // or this dispatcher's next process, never saw that death) hand those keys out before the
    // bound, beside them.
    if m.handover.waits_on_dead(Instant::now()) {
        warn!(lease = %m.config.identity, "leaving the Lease to expire: reconciles its previous process (or term), or a member that died, started may still run");
        return;
    }
    m.release().await;
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

/// What became of the writes of this dispatcher's Lease (`kube_dispatch_lease_renewals_total`),
/// and the members it judged dead (`kube_dispatch_members_judged_dead_total`). Cheap to clone:
/// clones count together.
#[derive(Clone, Debug, Default)]
pub struct LeaseMetrics {
    renewals: Family<OutcomeLabel, Counter>,
    judged_dead: Counter,
}

impl LeaseMetrics {
    /// Counted in `metrics`.
    pub fn new(metrics: &Metrics) -> Self {
        let counts = Self::default();
        metrics.register(
            "kube_dispatch_lease_renewals",
            "Writes of this dispatcher's Lease, each a renewal, by outcome (accepted, conflict, failed, timeout)",
            counts.renewals.clone(),
        );
        metrics.register(
            "kube_dispatch_members_judged_dead",
            "Dispatchers this one judged dead (Lease expired, or deleted without the drained mark): the keys that move from each wait until its reconciles are over, at most the handover bound; a clean rollout judges none",
            counts.judged_dead.clone(),
        );
        counts
    }

    /// A write ended with `outcome`.
    pub fn count(&self, outcome: &'static str) {
        self.renewals.get_or_create(&OutcomeLabel { outcome }).inc();
    }

    /// A member was judged dead.
    pub fn judged_dead(&self) {
        self.judged_dead.inc();
    }
}

/// The shortest time between two writes of the Lease made for new sessions (renewals on the
/// period are not held back): a session opened in a storm waits at most this long plus a
/// write's round trip to be handed keys, and a thousand opens a second cost five writes.
pub const SESSION_WRITE_SPACING: Duration = Duration::from_millis(200);

/// When the writes of the Lease that new sessions ask for (or sessions that ended idle, to be
/// listed no more) are made: at once, a process's first included, unless one was made for
/// sessions within [`SESSION_WRITE_SPACING`], so a storm of opens costs the API server (and
/// every dispatcher's watch of the Leases) a few writes a second, each listing every session
/// opened meanwhile. Other writes (renewals on the period, ring changes) do not hold one back:
/// counted, they made a session opened just after one wait the spacing for nothing.
#[derive(Debug, Default)]
struct SessionWrites {
    last: Option<tokio::time::Instant>,
}

impl SessionWrites {
    /// When a write wanted at `now` is due.
    fn due(&self, now: tokio::time::Instant) -> tokio::time::Instant {
        self.last
            .map_or(now, |last| now.max(last + SESSION_WRITE_SPACING))
    }

    /// A write for sessions was made at `now`.
    fn made(&mut self, now: tokio::time::Instant) {
        self.last = Some(now);
    }
}

/// The membership loop's state: this dispatcher's Lease as last written, the handover gate,
/// the view of the others' Leases, and what the loop already said or asked for.
struct Membership {
    leases: Api<Lease>,
    config: LeaseConfig,
    ring_key: RingKey,
    slice: watch::Sender<Arc<Slice>>,
    released: watch::Receiver<Option<String>>,
    sessions: Arc<LeaseSessions>,
    handover: Handover,
    /// What became of each write of the Lease, and the members judged dead.
    lease_metrics: LeaseMetrics,
    renew_tick: tokio::time::Interval,
    lease_watch: LeaseWatch,
    /// The resourceVersion of this dispatcher's Lease as last known: each write is made only
    /// over it (see `renew`).
    version: Option<u128>,
    /// Members seen to die whose Lease this process knew, when, and that Lease's
    /// resourceVersion then (`collect_dead` deletes it once the bound has passed).
    dead: HashMap<String, (Instant, u128)>,
    /// Start of the last renewal the API server accepted.
    renewed: Option<Instant>,
    /// What the handover waits for, as last logged.
    waiting: Option<String>,
    /// The resourceVersion of this dispatcher's last renewal the API server accepted.
    written: u128,
    /// The last whole and current view of the live members (see `Membership::judge`).
    live: BTreeMap<String, Peer>,
    behind_since: Option<Instant>,
    behind_warned: bool,
    /// The last renewal withheld the released ring (a member that died is being waited out).
    withheld: bool,
    /// Live members already reported for placing keys by another ring key.
    mismatched: BTreeSet<String>,
    /// What this dispatcher last renewed at once to publish as awaited, and the newest peer
    /// adoption it last renewed at once to release for: each asks for one write, not one per
    /// pass (a failing API server is not asked again until the period).
    awaits_asked: Option<(String, u128)>,
    owed_asked: Option<u128>,
    /// This dispatcher's last accepted write, as the others see it: what it released, having
    /// seen what, at which resourceVersion.
    own: Peer,
    /// Reports of ended sessions of members that died, carried on the Lease.
    relayed: Relayed,
    /// The warm-up before joining: the Lease carries the mark until it ends.
    warm: WarmUp,
    /// Whether the last write of the Lease sent carried the warming mark.
    mark_sent: bool,
    /// Whether this dispatcher still hands out nothing for its warm-up: until a view judged
    /// whole and current shows its Lease without the mark. The others count it a member only
    /// from that write, and may serve its keys until then; and a view from before the write
    /// may leave out a peer that took its own mark off earlier, which would then count on
    /// this dispatcher's release.
    mark_accepted: bool,
    /// Whether the last accepted write of the Lease carried no mark.
    unmark_accepted: bool,
}

impl Membership {
    /// Reads this dispatcher's Lease: one still there, unreleased, means the previous process
    /// died, and nothing is handed out until reconciles it started are over.
    async fn start(
        leases: Api<Lease>,
        config: LeaseConfig,
        ring_key: RingKey,
        slice: watch::Sender<Arc<Slice>>,
        released: watch::Receiver<Option<String>>,
        (sessions, lease_metrics, warm): (Arc<LeaseSessions>, LeaseMetrics, WarmUp),
    ) -> Self {
        let started = Instant::now();
        let mut version: Option<u128> = None;
        let mut found_none = false;
        // A Lease of ours that is still there was not released: the previous process died.
        // One still marked warming, or bare, is as good as none: its process handed nothing
        // out (nothing is handed out before a view shows the Lease without the mark,
        // `mark_accepted`), and no other dispatcher counted it a member.
        // The sessions that Lease lists are every session the previous process may have
        // handed keys to: once each is reported ended, its reconciles are over.
        let mut listed = None;
        let predecessor_died = match leases.get_opt(&config.identity).await {
            Ok(found) => {
                let state = found.as_ref().map(lease_state);
                found_none = state
                    .as_ref()
                    .is_none_or(|s| s.warming || s.holder.is_empty());
                version = state.as_ref().and_then(|s| known(s.resource_version));
                listed = state.as_ref().and_then(|s| s.sessions.clone());
                state.is_some_and(|s| !s.holder.is_empty() && !s.drained && !s.warming)
            }
            Err(e) => {
                warn!(error = %e, "cannot read this dispatcher's Lease; assuming its previous process died");
                true
            }
        };
        // Only a dispatcher that is no member warms up: one whose Lease is still there may
        // still be on the others' rings (a crash, a drain whose delete failed), and joins at once.
        if !found_none {
            warm.end();
        } else if warm.warming() {
            info!(
                lease = %config.identity,
                most = ?warm.until().saturating_duration_since(tokio::time::Instant::now()),
                "warming up before joining the ring: the others keep serving what moves here until this dispatcher has made and listed their controller groups"
            );
        }
        if predecessor_died {
            warn!(
                lease = %config.identity,
                most = ?config.handover_bound,
                sessions = listed.as_ref().map(|s| s.len()),
                "found this dispatcher's Lease unreleased: its previous process died; handing out nothing until reconciles it started are over (each session it listed reported ended by its replica, or the bound)"
            );
        }
        let handover = Handover::new(
            &config.identity,
            config.handover_bound,
            started,
            predecessor_died,
        )
        .predecessor_listed(listed)
        .with_ring_key(ring_key);
        let mut renew_tick = tokio::time::interval(config.renew_period);
        renew_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // A dispatcher judges membership only on a current view of the Leases (below), so after a
        // cut it serves nothing until this watch is back: retry it as often as the Lease is renewed
        // (a watch of a few Leases), not with the watcher's default of up to 30 s.
        let lease_watch = LeaseWatch::new(leases.clone(), config.renew_period);
        Self {
            leases,
            config,
            ring_key,
            slice,
            released,
            sessions,
            handover,
            lease_metrics,
            renew_tick,
            lease_watch,
            version,
            dead: HashMap::new(),
            renewed: None,
            waiting: None,
            written: 0,
            live: BTreeMap::new(),
            behind_since: None,
            behind_warned: false,
            withheld: false,
            mismatched: BTreeSet::new(),
            awaits_asked: None,
            owed_asked: None,
            own: Peer::default(),
            relayed: Relayed::default(),
            mark_sent: warm.warming(),
            mark_accepted: warm.warming(),
            unmark_accepted: false,
            warm,
        }
    }
}

impl Membership {
    /// The live members other than this dispatcher that say where they serve.
    fn warm_peers(&self) -> BTreeMap<String, WarmPeer> {
        self.live
            .iter()
            .filter(|(name, _)| **name != self.config.identity)
            .filter_map(|(name, peer)| {
                let peer_at = WarmPeer {
                    address: peer.address.clone()?,
                    serves_groups: peer.lists(capabilities::tier::PEER_GROUPS),
                };
                Some((name.clone(), peer_at))
            })
            .collect()
    }
}

/// A resourceVersion read from a Lease, if it is one (`lease_state` reads 0 for none).
fn known(resource_version: u128) -> Option<u128> {
    (resource_version > 0).then_some(resource_version)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_for_sessions_is_made_at_once_unless_one_was_made_for_sessions_just_before() {
        let start = tokio::time::Instant::now();
        let mut writes = SessionWrites::default();
        // The first (a process's first too), whatever was written before for other reasons:
        // at once.
        assert_eq!(writes.due(start), start);
        writes.made(start);
        // Within the spacing of it: when the spacing ends.
        let soon = start + Duration::from_millis(50);
        assert_eq!(writes.due(soon), start + SESSION_WRITE_SPACING);
        // Past it: at once.
        let later = start + SESSION_WRITE_SPACING + Duration::from_millis(1);
        assert_eq!(writes.due(later), later);
        // A storm: one write per spacing at most.
        let mut at = later;
        writes.made(at);
        for _ in 0..10 {
            let due = writes.due(at + Duration::from_millis(1));
            assert_eq!(due - at, SESSION_WRITE_SPACING);
            writes.made(due);
            at = due;
        }
    }
}
