//! Ring membership from coordination.k8s.io Leases, and the handover gate fed from them.
//!
//! Each dispatcher holds a Lease named after its identity and renews it, carrying the ring it
//! has released ([`RELEASED_ANNOTATION`]); every dispatcher computes the ring from the Leases
//! it sees renewed ([`kube_dispatch_runtime::leases::LeaseWatch`], judged by
//! [`kube_dispatch_core::leases`]), and from the releases decides which keys it may hand out
//! ([`kube_dispatch_core::handover`], `HANDOVER.md`). A dispatcher that cannot renew its own
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

use k8s_openapi::{api::coordination::v1::Lease, apimachinery::pkg::apis::meta::v1::MicroTime};
use kube::{
    Api, Client,
    api::{DeleteParams, Patch, PatchParams, Preconditions},
};
use kube_dispatch_core::{
    handover::{Handover, Slice},
    leases::Peer,
    listing::Relayed,
};
use kube_dispatch_proto::{
    RingKey,
    lease::{
        ADDRESS_ANNOTATION, AWAITS_ANNOTATION, DRAINED_ANNOTATION, ENDED_ANNOTATION, LEASE_LABEL,
        RELEASED_AFTER_ANNOTATION, RELEASED_ANNOTATION, RING_KEY_ANNOTATION, SESSIONS_ANNOTATION,
        SESSIONS_OVERFLOW, awaits_value,
    },
};
use kube_dispatch_runtime::leases::{LeaseWatch, lease_state};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::{config::LeaseConfig, lease_sessions::LeaseSessions};

/// Holds this dispatcher's Lease, computes the ring and the handover gate from the Leases, and
/// publishes what this dispatcher serves on `slice`, until `stop`. The ring the core has
/// released (`released`) is written on the Lease, and so are the sessions `sessions` lists and
/// the reports of ended sessions of members that died it received (`HANDOVER.md`, "Ending the
/// wait for a member that died, by reports"). After `stop`, the Lease is deleted (so the
/// others take over at once) only if `clean` is set, that is when nothing handed out is still in
/// flight; otherwise it is left to expire and the others wait out the handover bound.
#[allow(clippy::too_many_arguments)]
pub async fn run(
    client: Client,
    config: LeaseConfig,
    ring_key: RingKey,
    slice: watch::Sender<Arc<Slice>>,
    mut released: watch::Receiver<Option<String>>,
    sessions: Arc<LeaseSessions>,
    stop: CancellationToken,
    clean: Arc<AtomicBool>,
) {
    let leases: Api<Lease> = Api::namespaced(client, &config.namespace);
    let started = Instant::now();
    // The resourceVersion of this dispatcher's Lease as last known: each write is made only
    // over it (see `renew`).
    let mut version: Option<u128> = None;
    // A Lease of ours that is still there was not released: the previous process died.
    let predecessor_died = match leases.get_opt(&config.identity).await {
        Ok(found) => found.is_some_and(|l| {
            let state = lease_state(&l);
            version = known(state.resource_version);
            !state.holder.is_empty() && !state.drained
        }),
        Err(e) => {
            warn!(error = %e, "cannot read this dispatcher's Lease; assuming its previous process died");
            true
        }
    };
    if predecessor_died {
        warn!(
            lease = %config.identity,
            wait = ?config.handover_bound,
            "found this dispatcher's Lease unreleased: its previous process died; handing out nothing until reconciles it started are over"
        );
    }
    let mut handover = Handover::new(
        &config.identity,
        config.handover_bound,
        started,
        predecessor_died,
    )
    .with_ring_key(ring_key);
    let mut renew_tick = tokio::time::interval(config.renew_period);
    renew_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // A dispatcher judges membership only on a current view of the Leases (below), so after a
    // cut it serves nothing until this watch is back: retry it as often as the Lease is renewed
    // (a watch of a few Leases), not with the watcher's default of up to 30 s.
    let mut lease_watch = LeaseWatch::new(leases.clone(), config.renew_period);
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    // Members seen to die, when, and their Lease's resourceVersion then.
    let mut dead: HashMap<String, (Instant, u128)> = HashMap::new();
    // Start of the last renewal the API server accepted.
    let mut renewed: Option<Instant> = None;
    let mut waiting = None;
    // The resourceVersion of this dispatcher's last renewal the API server accepted, and the
    // last whole and current view of the live members (see below).
    let mut written: u128 = 0;
    let mut live: BTreeMap<String, Peer> = BTreeMap::new();
    let mut behind_since: Option<Instant> = None;
    let mut behind_warned = false;
    // The last renewal withheld the released ring (a member that died is being waited out).
    let mut withheld = false;
    // Live members already reported for placing keys by another ring key.
    let mut mismatched: BTreeSet<String> = BTreeSet::new();
    // What this dispatcher last renewed at once to publish as awaited, and the newest peer
    // adoption it last renewed at once to release for: each asks for one write, not one per
    // pass (a failing API server is not asked again until the period).
    let mut awaits_asked: Option<(String, u128)> = None;
    let mut owed_asked: Option<u128> = None;
    // This dispatcher's last accepted write, as the others see it: what it released, having
    // seen what, at which resourceVersion.
    let mut own = Peer::default();
    // Reports of ended sessions of members that died, carried on the Lease.
    let mut relayed = Relayed::default();
    loop {
        // Renew on the period, and at once when the released ring changes.
        let renew_due = tokio::select! {
            () = stop.cancelled() => break,
            _ = renew_tick.tick() => true,
            Ok(()) = released.changed() => true,
            // A new session is handed keys once a write lists it.
            () = sessions.write_wanted() => true,
            more = lease_watch.next() => if more { false } else { break },
            _ = tick.tick() => false,
        };
        // A loop that did not run for a Lease's duration (the process was paused, its node
        // frozen) was fenced all that time, and the others may have taken its keys over: say
        // so before a renewal can make it look current, so it serves nothing until a fresh
        // handover completes.
        let resumed = Instant::now();
        if renewed.is_some_and(|at| resumed >= at + config.duration) {
            let next = handover.update(&live, lease_watch.observations.newest(), true, resumed);
            slice.send_if_modified(|current| {
                let changed = current.settled.is_some();
                if changed {
                    *current = Arc::new(next);
                }
                changed
            });
        }
        if renew_due {
            let at = Instant::now();
            let id = released.borrow_and_update().clone();
            // While it waits out a member that died, this dispatcher releases no ring: a
            // dispatcher that joins meanwhile may never have seen the dead member (a Lease
            // deleted without the drained mark leaves nothing to see), and would otherwise
            // hand out its keys as soon as the others released.
            withheld = handover.waits_on_dead(at);
            let id = handover.releasable(id, at);
            let seen = lease_watch.observations.newest();
            let listing = sessions.to_write(at);
            // While its previous process's reconciles may still run, its sessions are not all
            // the others would have to wait for. Nor does a write made over no known version
            // list them: it could land after a later one (a request abandoned at its timeout
            // may still be applied) and take sessions off the Lease.
            let listed = if handover.holds_for_predecessor(at) || version.is_none() {
                SESSIONS_OVERFLOW
            } else {
                listing.value.as_str()
            };
            let ended = relayed.value(at, config.handover_bound);
            // A request the API server never answers must not hold this loop, which is what
            // fences this dispatcher when its Lease goes unrenewed.
            let renewal = tokio::time::timeout(
                config.renew_period,
                renew(
                    &leases,
                    &config,
                    ring_key,
                    Marks {
                        released: id.as_deref().map(|id| (id, seen)),
                        awaits: handover.awaits(),
                        drained: false,
                        sessions: Some(listed),
                        ended: &ended,
                    },
                    version,
                ),
            );
            match renewal.await {
                Ok(Renewal::Accepted(rv)) => {
                    renewed = Some(at);
                    version = known(rv);
                    sessions.written(&listing);
                    renewal_accepted(&handover, &slice, at + config.duration, Instant::now);
                    written = written.max(rv);
                    own = Peer {
                        released: id,
                        released_after: seen,
                        resource_version: rv,
                        ..Peer::default()
                    };
                }
                Ok(Renewal::Conflict) => {
                    // Written meanwhile (an abandoned request applied late, a hand edit): read
                    // its version and write again at once.
                    version = match tokio::time::timeout(
                        config.renew_period,
                        leases.get_opt(&config.identity),
                    )
                    .await
                    {
                        Ok(Ok(found)) => {
                            found.and_then(|l| known(lease_state(&l).resource_version))
                        }
                        _ => None,
                    };
                    renew_tick.reset_immediately();
                }
                Ok(Renewal::Failed) => {}
                Err(_) => warn!(
                    lease = %config.identity,
                    timeout = ?config.renew_period,
                    "renewing the dispatcher Lease took longer than the renew period; abandoned"
                ),
            }
        }
        let now = Instant::now();
        // Whether this pass judged the Leases on a whole and current view.
        let mut judged = false;
        let listing = lease_watch.listing();
        let observations = &mut lease_watch.observations;
        // Members are judged only on a view of the Leases that is whole (no list under way)
        // and current: it shows this dispatcher's last accepted renewal, and so every Lease
        // write before it. A partial or lagging view makes live members look absent or silent
        // (the first list shows one Lease at a time; a watch that reconnects after a cut
        // replays late), and a dispatcher that took it for the truth could find itself alone
        // and serve keys others still hand out. Meanwhile the last such view stands.
        if listing || observations.newest() < written {
            let since = *behind_since.get_or_insert(now);
            if !behind_warned && now >= since + config.duration {
                behind_warned = true;
                warn!(behind_for = ?(now - since), "the watch of dispatcher Leases lags this dispatcher's own renewals: membership changes wait until it catches up");
            }
        } else {
            if behind_warned {
                info!("the watch of dispatcher Leases caught up");
            }
            behind_since = None;
            behind_warned = false;
            let gone;
            (live, gone) = handover.judge(observations, config.grace, now);
            judged = true;
            for (gone, died) in gone {
                if died {
                    warn!(member = %gone, "dispatcher stopped renewing its Lease: taking over its keys once reconciles it handed out are over");
                    let rv = observations.state(&gone).map_or(0, |s| s.resource_version);
                    dead.insert(gone, (now, rv));
                } else {
                    info!(member = %gone, "dispatcher drained and released its Lease");
                }
            }
            for member in live.keys() {
                let theirs = observations
                    .state(member)
                    .and_then(|s| s.ring_key.as_deref());
                if let Some(theirs) = theirs
                    && theirs != ring_key.as_str()
                    && mismatched.insert(member.clone())
                {
                    error!(
                        member = %member,
                        theirs,
                        ours = ring_key.as_str(),
                        "a live dispatcher places keys by another ring key (--ring-key): no handover with it can complete, and keys that move stay held; give every dispatcher of the tier the same"
                    );
                }
            }
            mismatched.retain(|m| live.contains_key(m));
        }
        // A dead member's Lease stays behind; once the bound has passed, nothing it handed out
        // can still run, so delete the Lease (if it is still the one seen dead): dispatchers
        // that start later then need not wait the bound out for it again.
        let collect: Vec<(String, u128)> = dead
            .iter()
            .filter(|(name, _)| !live.contains_key(*name))
            .filter(|(_, (since, _))| now >= *since + config.handover_bound + config.grace)
            .map(|(name, (_, rv))| (name.clone(), *rv))
            .collect();
        for (name, rv) in collect {
            dead.remove(&name);
            // Bounded for the same reason as the renewal; an unanswered delete is retried by
            // nobody, and the Lease then merely costs later joiners the bound.
            let _ =
                tokio::time::timeout(config.renew_period, delete_dead_lease(&leases, &name, rv))
                    .await;
        }
        dead.retain(|name, _| !live.contains_key(name));
        let observations = &lease_watch.observations;
        let fenced = renewed.is_none_or(|at| now >= at + config.duration);
        let next = handover.update(&live, observations.newest(), fenced, now);
        // Reports of sessions a member that died listed (checked as they arrived) are carried
        // on the Lease, written at once: each member ends its wait once it sees every such
        // session reported.
        let mut carried = false;
        for (member, tag) in sessions.take_reports() {
            if relayed.report(&member, tag, now) {
                info!(%member, session = format_args!("{tag:016x}"), "a replica reported a session of a dispatcher that died ended");
                carried = true;
            }
        }
        if carried {
            renew_tick.reset_immediately();
        }
        // Replicas are asked about members that died and are not live again (a new process of
        // one lists sessions of its own), and only on a view just judged whole and current: a
        // fenced dispatcher names nobody, and one whose view lags (just unfenced, or after a
        // pause, every Lease looks old in it) leaves the list as it was until its watch has
        // caught up. Never itself.
        if fenced {
            sessions.set_dead(Default::default());
        } else if judged {
            sessions.set_dead(
                handover
                    .awaited()
                    .filter(|(member, _)| !live.contains_key(*member) && *member != config.identity)
                    .map(|(member, tags)| (member.to_owned(), tags.clone()))
                    .collect(),
            );
        }
        if withheld && !handover.waits_on_dead(now) {
            // The wait is over: write the release now rather than at the next period.
            withheld = false;
            renew_tick.reset_immediately();
        }
        // A joiner publishes what it awaits at once, and a member whose release came before a
        // peer adopted the ring writes it again at once: releases count only after the
        // adoption, and the periodic renewal would leave the joiner's keys held for up to a
        // renew period (`HANDOVER.md`, "Awaits"). A fenced dispatcher's marker moves with every
        // Lease write it sees (`Handover::update`) and its renewals may be failing: it goes out
        // with the renewals alone.
        let awaits = handover.awaits();
        if awaits != awaits_asked {
            if awaits.is_some() && !fenced {
                renew_tick.reset_immediately();
            }
            awaits_asked = awaits;
        }
        let releasing = handover.releasable(released.borrow().clone(), now);
        if let Some(at) = handover.owed_release(&live, releasing.as_deref(), &own)
            && owed_asked.is_none_or(|asked| at > asked)
        {
            owed_asked = Some(at);
            renew_tick.reset_immediately();
        }
        let why = handover.waiting_for(&live);
        if why != waiting {
            if let Some(why) = &why {
                info!(waiting_for = %why, "handover pending: keys that moved here are held");
            }
            waiting = why;
        }
        slice.send_if_modified(|current| {
            let same = current.ring.members() == next.ring.members()
                && current.settled.as_ref().map(|s| s.members())
                    == next.settled.as_ref().map(|s| s.members());
            if !same {
                *current = Arc::new(next);
            }
            !same
        });
    }
    if !clean.load(Ordering::Acquire) {
        warn!(lease = %config.identity, "leaving the Lease to expire: reconciles were still in flight");
        return;
    }
    // Only a Lease deleted with the drained mark is a release (leases.md); deleted without it,
    // the others would wait out the bound, which is safe but slow. The mark is written by the
    // same apply as every renewal, so if the delete fails, the next process's first renewal
    // takes it off again: it never outlives the drain it stands for.
    let id = handover.releasable(released.borrow().clone(), Instant::now());
    let seen = lease_watch.observations.newest();
    if !matches!(
        renew(
            &leases,
            &config,
            ring_key,
            Marks {
                released: id.as_deref().map(|id| (id, seen)),
                awaits: None,
                drained: true,
                sessions: None,
                ended: "",
            },
            None,
        )
        .await,
        Renewal::Accepted(_)
    ) {
        warn!(lease = %config.identity, "could not mark the dispatcher Lease drained: the others wait out the handover bound");
    }
    match leases
        .delete(&config.identity, &DeleteParams::default())
        .await
    {
        Ok(_) => info!(lease = %config.identity, "drained: released the dispatcher Lease"),
        Err(e) => {
            warn!(lease = %config.identity, error = %e, "could not release the dispatcher Lease; it expires by itself")
        }
    }
}

/// Deletes the Lease of a member that died, unless it changed since it was seen dead (the
/// member came back).
async fn delete_dead_lease(leases: &Api<Lease>, name: &str, resource_version: u128) {
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            resource_version: Some(resource_version.to_string()),
            uid: None,
        }),
        ..DeleteParams::default()
    };
    match leases.delete(name, &params).await {
        Ok(_) => {
            info!(lease = %name, "deleted the Lease of a dispatcher that died, now that the bound has passed")
        }
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
        Err(e) => {
            warn!(lease = %name, error = %e, "could not delete the Lease of a dispatcher that died")
        }
    }
}

/// What a renewal writes on the Lease beside its address and ring key.
struct Marks<'a> {
    /// The ring released, with the newest Lease resourceVersion seen when it was written.
    released: Option<(&'a str, u128)>,
    /// The ring this dispatcher waits for the others to release, with the newest Lease
    /// resourceVersion it had seen when it adopted it ([`Handover::awaits`]).
    awaits: Option<(String, u128)>,
    /// The drained mark: nothing handed out runs any more, and the Lease is deleted next.
    drained: bool,
    /// The sessions listed ([`LeaseSessions`]); none on the drained write.
    sessions: Option<&'a str>,
    /// The reports of ended sessions carried (empty: none).
    ended: &'a str,
}

/// A resourceVersion read from a Lease, if it is one (`lease_state` reads 0 for none).
fn known(resource_version: u128) -> Option<u128> {
    (resource_version > 0).then_some(resource_version)
}

/// How a write of the Lease ended.
enum Renewal {
    /// Accepted, at this resourceVersion.
    Accepted(u128),
    /// Refused: the Lease is no longer at the version the write was made over.
    Conflict,
    /// Failed otherwise.
    Failed,
}

/// Writes this dispatcher's Lease with a fresh renew time, its ring key and `marks`
/// (server-side apply: a mark left out is taken off), over resourceVersion `over` when given:
/// then a write that landed in between (one abandoned at its timeout and applied late) makes
/// it fail as a conflict rather than be overwritten, and such a write can never land after
/// this one.
async fn renew(
    leases: &Api<Lease>,
    config: &LeaseConfig,
    ring_key: RingKey,
    marks: Marks<'_>,
    over: Option<u128>,
) -> Renewal {
    let mut annotations = serde_json::Map::new();
    annotations.insert(ADDRESS_ANNOTATION.into(), config.address.clone().into());
    annotations.insert(RING_KEY_ANNOTATION.into(), ring_key.as_str().into());
    if marks.drained {
        annotations.insert(DRAINED_ANNOTATION.into(), "true".into());
    }
    if let Some((id, seen)) = marks.released {
        annotations.insert(RELEASED_ANNOTATION.into(), id.into());
        annotations.insert(RELEASED_AFTER_ANNOTATION.into(), seen.to_string().into());
    }
    if let Some((id, seen)) = &marks.awaits {
        annotations.insert(AWAITS_ANNOTATION.into(), awaits_value(id, *seen).into());
    }
    if let Some(listed) = marks.sessions {
        annotations.insert(SESSIONS_ANNOTATION.into(), listed.into());
    }
    if !marks.ended.is_empty() {
        annotations.insert(ENDED_ANNOTATION.into(), marks.ended.into());
    }
    let mut metadata = serde_json::json!({
        "name": config.identity,
        "labels": { LEASE_LABEL: "true" },
        "annotations": annotations,
    });
    if let Some(rv) = over {
        metadata["resourceVersion"] = rv.to_string().into();
    }
    let lease = serde_json::json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": metadata,
        "spec": {
            "holderIdentity": config.identity,
            "leaseDurationSeconds": config.duration.as_secs().max(1),
            "renewTime": MicroTime(k8s_openapi::jiff::Timestamp::now()),
        },
    });
    let params = PatchParams::apply("kube-dispatch-dispatcher").force();
    match leases
        .patch(&config.identity, &params, &Patch::Apply(&lease))
        .await
    {
        Ok(lease) => Renewal::Accepted(lease_state(&lease).resource_version),
        Err(kube::Error::Api(s)) if s.code == 409 => {
            info!(lease = %config.identity, "the dispatcher Lease was written since this dispatcher last wrote it; reading it and writing again");
            Renewal::Conflict
        }
        Err(e) => {
            warn!(lease = %config.identity, error = %e, "renewing the dispatcher Lease failed");
            Renewal::Failed
        }
    }
}

/// A renewal of this dispatcher's Lease was accepted: its slices hand out until `until`. If
/// the Lease had run out by then (`now`, read after the deadline moved, so that a deadline
/// passing meanwhile counts), they handed out nothing and hand out again now, with no new
/// slice published: the slice is marked changed, so that polls waiting on it are answered at
/// once rather than at their timeout.
fn renewal_accepted(
    handover: &Handover,
    slice: &watch::Sender<Arc<Slice>>,
    until: Instant,
    now: impl FnOnce() -> Instant,
) {
    let before = handover.renewed(until);
    if before.is_some_and(|deadline| deadline <= now()) {
        slice.send_modify(|_| ());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A renewal accepted after the Lease ran out marks the slice changed (a poll waiting on it
    /// is answered: the keys are handed out again); one accepted in time publishes nothing.
    #[test]
    fn a_renewal_after_the_lease_ran_out_wakes_the_slices_waiters() {
        let t0 = Instant::now();
        let mut handover = Handover::new("d0", Duration::from_secs(10), t0, false);
        let slice = handover.update(&BTreeMap::new(), 0, false, t0);
        let (tx, mut rx) = watch::channel(Arc::new(slice));
        rx.mark_unchanged();
        let lease = Duration::from_secs(4);
        // The first renewal: the Lease was never current.
        renewal_accepted(&handover, &tx, t0 + lease, || t0);
        assert!(rx.has_changed().unwrap_or(false), "the first renewal wakes");
        rx.mark_unchanged();
        // Renewed in time: nothing to tell.
        renewal_accepted(&handover, &tx, t0 + 2 * lease, || t0 + lease / 2);
        assert!(
            !rx.has_changed().unwrap_or(true),
            "a renewal in time publishes nothing"
        );
        // The answer comes after the deadline (t0 + 2 × lease) had passed.
        renewal_accepted(&handover, &tx, t0 + 4 * lease, || t0 + 3 * lease);
        assert!(
            rx.has_changed().unwrap_or(false),
            "a late renewal wakes the waiters"
        );
    }
}
