//! Writing this dispatcher's Lease: renewals with their marks (released, awaits, sessions,
//! reports), the drained release, and the deletion of a dead member's Lease past the bound.

use std::{sync::Arc, time::Instant};

use k8s_openapi::{api::coordination::v1::Lease, apimachinery::pkg::apis::meta::v1::MicroTime};
use kube::{
    Api,
    api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions},
};
use kube_dispatch_core::{
    handover::{Handover, Slice},
    leases::Peer,
};
use kube_dispatch_proto::{
    RingKey, capabilities,
    lease::{
        ADDRESS_ANNOTATION, AWAITS_ANNOTATION, CAPABILITIES_ANNOTATION, DRAINED_ANNOTATION,
        ENDED_ANNOTATION, LEASE_LABEL, RELEASED_AFTER_ANNOTATION, RELEASED_ANNOTATION,
        RING_KEY_ANNOTATION, SESSIONS_ANNOTATION, SESSIONS_OVERFLOW, WARMING_ANNOTATION,
        awaits_value, capabilities_value,
    },
};
use kube_dispatch_server::leases::lease_state;
use tokio::sync::watch;
use tracing::{info, warn};

use super::{Membership, known};
use crate::config::LeaseConfig;

/// Deletes the Lease of a member that died, unless it changed since it was seen dead (the
/// member came back).
pub(super) async fn delete_dead_lease(leases: &Api<Lease>, name: &str, resource_version: u128) {
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

/// Who writes the dispatcher's Lease, for server-side apply.
const FIELD_MANAGER: &str = "kube-dispatch-dispatcher";

/// What a renewal writes on the Lease beside its address and ring key.
struct Marks<'a> {
    /// The ring released, with the newest Lease resourceVersion seen when it was written.
    released: Option<(&'a str, u128)>,
    /// The ring this dispatcher waits for the others to release, with the newest Lease
    /// resourceVersion it had seen when it adopted it ([`Handover::awaits`]).
    awaits: Option<(String, u128)>,
    /// The drained mark: nothing handed out runs any more, and the Lease is deleted next.
    drained: bool,
    /// The warming mark: not a member yet (`super::warm_up`).
    warming: bool,
    /// The sessions listed ([`LeaseSessions`]); none on the drained write.
    sessions: Option<&'a str>,
    /// The reports of ended sessions carried (empty: none).
    ended: &'a str,
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
async fn write(
    leases: &Api<Lease>,
    config: &LeaseConfig,
    ring_key: RingKey,
    marks: Marks<'_>,
    over: Option<u128>,
) -> Renewal {
    let mut annotations = serde_json::Map::new();
    annotations.insert(ADDRESS_ANNOTATION.into(), config.address.clone().into());
    annotations.insert(RING_KEY_ANNOTATION.into(), ring_key.as_str().into());
    annotations.insert(
        CAPABILITIES_ANNOTATION.into(),
        capabilities_value(&capabilities::tier::ALL).into(),
    );
    if marks.drained {
        annotations.insert(DRAINED_ANNOTATION.into(), "true".into());
    }
    if marks.warming {
        annotations.insert(WARMING_ANNOTATION.into(), "true".into());
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
    let params = PatchParams::apply(FIELD_MANAGER).force();
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

/// Creates this dispatcher's Lease bare (its name and label; no holder, so no member to anyone)
/// and returns its resourceVersion, or reads the one there: the first write with marks is then
/// made over a known version too. Made over none, a write abandoned at its timeout could land
/// after a later one and put back what that one took off (the warming mark above all); a
/// create that lands late fails instead. Of the fields the renewals write, the create owns only
/// the label, which every renewal writes too.
async fn create_bare(leases: &Api<Lease>, config: &LeaseConfig) -> Option<u128> {
    let bare = serde_json::json!({
        "metadata": { "name": config.identity, "labels": { LEASE_LABEL: "true" } },
    });
    let bare: Lease = serde_json::from_value(bare).ok()?;
    let post = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PostParams::default()
    };
    match leases.create(&post, &bare).await {
        Ok(lease) => known(lease_state(&lease).resource_version),
        Err(kube::Error::Api(s)) if s.code == 409 => leases
            .get_opt(&config.identity)
            .await
            .ok()
            .flatten()
            .and_then(|l| known(lease_state(&l).resource_version)),
        Err(e) => {
            warn!(lease = %config.identity, error = %e, "could not create the dispatcher Lease");
            None
        }
    }
}

/// A renewal of this dispatcher's Lease was accepted: its slices hand out until `until`. If
/// the Lease had run out by then (`now`, read after the deadline moved, so that a deadline
/// passing meanwhile counts), they handed out nothing and hand out again now, with no new
/// slice published: the slice is marked changed, so that polls waiting on it are answered at
/// once rather than at their timeout.
pub(super) fn renewal_accepted(
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

impl Membership {
    /// Renews this dispatcher's Lease, started at `at`: the ring it released (none while it
    /// waits out a member that died), what it awaits, the sessions it lists and the reports it
    /// carries, over the resourceVersion it last wrote.
    pub(super) async fn renew(&mut self, at: Instant) {
        let config = &self.config;
        if self.version.is_none() {
            let created = create_bare(&self.leases, config);
            self.version = tokio::time::timeout(config.renew_period, created)
                .await
                .ok()
                .flatten();
        }
        // Written over no version, a write abandoned at its timeout could land after a later
        // one and undo it (sessions it took off, the warming mark): try again next period.
        let Some(version) = self.version else {
            self.lease_metrics.count("failed");
            return;
        };
        let handover = &mut self.handover;
        let id = self.released.borrow_and_update().clone();
        // While it waits out a member that died, this dispatcher releases no ring: a
        // dispatcher that joins meanwhile may never have seen the dead member (a Lease
        // deleted without the drained mark leaves nothing to see), and would otherwise
        // hand out its keys as soon as the others released.
        self.withheld = handover.waits_on_dead(at);
        let id = handover.releasable(id, at);
        let seen = self.lease_watch.observations.newest();
        let listing = self.sessions.to_write(at);
        // While it waits out a member that died, or its own previous process, its sessions
        // are not all the others would have to wait for if it died too: that member's
        // reconciles may still run, and a dispatcher that never saw it die (one that joined
        // since, or this one's next process) relies on this one's wait alone.
        let listed = if handover.waits_on_dead(at) {
            SESSIONS_OVERFLOW
        } else {
            listing.value.as_str()
        };
        let ended = self.relayed.value(at, config.handover_bound);
        let warming = self.warm.warming();
        self.mark_sent = warming;
        // A request the API server never answers must not hold this loop, which is what
        // fences this dispatcher when its Lease goes unrenewed.
        let renewal = tokio::time::timeout(
            config.renew_period,
            write(
                &self.leases,
                config,
                self.ring_key,
                Marks {
                    released: id.as_deref().map(|id| (id, seen)),
                    awaits: handover.awaits(),
                    drained: false,
                    warming,
                    sessions: Some(listed),
                    ended: &ended,
                },
                Some(version),
            ),
        );
        match renewal.await {
            Ok(Renewal::Accepted(rv)) => {
                self.lease_metrics.count("accepted");
                self.renewed = Some(at);
                self.unmark_accepted = !warming;
                self.version = known(rv);
                self.sessions.written(&listing);
                renewal_accepted(handover, &self.slice, at + config.duration, Instant::now);
                self.written = self.written.max(rv);
                self.own = Peer {
                    released: id,
                    released_after: seen,
                    resource_version: rv,
                    ..Peer::default()
                };
            }
            Ok(Renewal::Conflict) => {
                self.lease_metrics.count("conflict");
                // Written meanwhile (an abandoned request applied late, a hand edit): read
                // its version and write again at once.
                self.version = match tokio::time::timeout(
                    config.renew_period,
                    self.leases.get_opt(&config.identity),
                )
                .await
                {
                    Ok(Ok(found)) => found.and_then(|l| known(lease_state(&l).resource_version)),
                    _ => None,
                };
                self.renew_tick.reset_immediately();
            }
            Ok(Renewal::Failed) => self.lease_metrics.count("failed"),
            Err(_) => {
                self.lease_metrics.count("timeout");
                warn!(
                lease = %config.identity,
                timeout = ?config.renew_period,
                "renewing the dispatcher Lease took longer than the renew period; abandoned"
                );
            }
        }
    }

    /// Releases the Lease after a clean drain: marks it drained, then deletes it.
    ///
    /// Only a Lease deleted with the drained mark is a release (leases.md); deleted without it,
    /// the others would wait out the bound, which is safe but slow. The mark is written by the
    /// same apply as every renewal, so if the delete fails, the next process's first renewal
    /// takes it off again: it never outlives the drain it stands for.
    pub(super) async fn release(self) {
        let config = &self.config;
        let id = self
            .handover
            .releasable(self.released.borrow().clone(), Instant::now());
        let seen = self.lease_watch.observations.newest();
        if !matches!(
            write(
                &self.leases,
                config,
                self.ring_key,
                Marks {
                    released: id.as_deref().map(|id| (id, seen)),
                    awaits: None,
                    drained: true,
                    // Never a member if it never sent a write without the mark: the others must
                    // not count it one as it leaves. Once it sent one, the others may count it
                    // a member already, and the drained mark is its clean release.
                    warming: self.mark_sent,
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
        match self
            .leases
            .delete(&config.identity, &DeleteParams::default())
            .await
        {
            Ok(_) => info!(lease = %config.identity, "drained: released the dispatcher Lease"),
            Err(e) => {
                warn!(lease = %config.identity, error = %e, "could not release the dispatcher Lease; it expires by itself")
            }
        }
    }
}

#[cfg(test)]
mod tests;
