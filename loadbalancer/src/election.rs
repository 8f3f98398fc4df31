//! Leader election on one Lease, and what leading means for the registry.

use std::{
    pin::Pin,
    sync::Arc,
    time::{Duration, Instant},
};

use futures::{Stream, StreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use kube::{
    Api, Client,
    runtime::{WatchStreamExt, watcher},
};
use kube_lease_manager::{LeaseManager, LeaseManagerBuilder, LeaseManagerError};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::registry::Registry;

/// The leader election on one Lease.
///
/// `kube-lease-manager` alone lets a standby sleep until the expiry it last read, however early
/// the leader gives the Lease up: a rolling update would leave controllers without a leading
/// load balancer for up to a whole `--lease-duration`. So every replica also watches the
/// Lease:
///
/// - a standby that sees it free (released by a stopping leader, or deleted) reads it again
///   with a fresh manager, which takes it at once;
/// - a leader that sees it free, held by another or deleted reads it (an event may predate its
///   own lock), and if it is not its own any more steps down and reads it again the same way
///   (it may take a free Lease back at once);
/// - a leader that cannot renew steps down once its last renewal seen is older than the Lease
///   duration less the grace, rather than lead on beside the standby that takes the Lease.
pub(crate) struct Election {
    pub(crate) client: Client,
    pub(crate) lease: String,
    pub(crate) namespace: String,
    pub(crate) identity: String,
    /// Lease duration and renewal grace, in whole seconds.
    pub(crate) duration: u64,
    pub(crate) grace: u64,
}

impl Election {
    /// The manager of the Lease, read (and created if missing) once.
    pub(crate) async fn build(&self) -> Result<LeaseManager, LeaseManagerError> {
        LeaseManagerBuilder::new(self.client.clone(), &self.lease)
            .with_namespace(&self.namespace)
            .with_identity(&self.identity)
            .with_duration(self.duration)
            .with_grace(self.grace)
            .build()
            .await
    }

    /// How long a renewal seen keeps this replica safely the leader: the Lease duration less
    /// the grace (the clock skew tolerated).
    fn held_for(&self) -> Duration {
        Duration::from_secs(self.duration.saturating_sub(self.grace).max(1))
    }

    /// Whether the Lease, read now, names this replica as its holder; also when it cannot be
    /// read (renewals decide then).
    async fn still_held(&self, leases: &Api<Lease>) -> bool {
        match leases.get_opt(&self.lease).await {
            Ok(lease) => {
                lease.and_then(|l| l.spec?.holder_identity).as_deref() == Some(&self.identity)
            }
            Err(_) => true,
        }
    }

    /// Elects until `stop`, mirroring whether this replica leads into `elected`, then releases
    /// the Lease if it holds it.
    pub(crate) async fn run(
        self,
        manager: LeaseManager,
        leases: Api<Lease>,
        elected: watch::Sender<bool>,
        stop: CancellationToken,
    ) -> Result<(), LeaseManagerError> {
        let mut seen = std::pin::pin!(lease_seen(leases.clone(), &self.lease));
        let mut manager = Some(Current::new(manager));
        // Until when this replica, if it leads, holds the Lease for sure: the last renewal seen
        // (its own election's or the watch's) plus `held_for`.
        let mut held_until = Instant::now();
        // Failures in a row, for the pause before the next attempt.
        let mut failures = 0u32;
        loop {
            let current = match &mut manager {
                Some(current) => current,
                None => {
                    let built = tokio::select! {
                        () = stop.cancelled() => break,
                        built = self.build() => built,
                    };
                    match built {
                        Ok(fresh) => manager.insert(Current::new(fresh)),
                        Err(e) => {
                            warn!(error = %e, "cannot read the leader Lease; trying again");
                            failures += 1;
                            if pause(failures, false, &stop).await {
                                break;
                            }
                            continue;
                        }
                    }
                }
            };
            let leading = *elected.borrow();
            tokio::select! {
                biased;
                () = stop.cancelled() => break,
                changed = &mut current.changed => match changed {
                    Ok(leads) => {
                        current.again();
                        failures = 0;
                        if leads {
                            held_until = Instant::now() + self.held_for();
                        }
                        elected.send_replace(leads);
                    }
                    Err(e) => {
                        current.again();
                        warn!(error = %e, lease = %self.lease, leading, "leader election failed; trying again");
                        failures += 1;
                        if leading && Instant::now() >= held_until {
                            warn!(lease = %self.lease, "no renewal of the leader Lease for longer than it is safe to lead: stepping down");
                            elected.send_replace(false);
                            manager = None;
                        } else if matches!(e, LeaseManagerError::NonexistentLease(_)) {
                            // Only a fresh manager creates it again.
                            manager = None;
                        }
                        // A leader retries well within its grace; a standby backs off.
                        if pause(failures, leading, &stop).await {
                            break;
                        }
                    }
                },
                Some(seen) = seen.next() => {
                    if leading {
                        if matches!(&seen, Seen::HeldBy(holder) if *holder == self.identity) {
                            held_until = Instant::now() + self.held_for();
                        } else if !self.still_held(&leases).await {
                            // Free, deleted, or taken: not this replica's any more (an event
                            // older than this replica's own lock is not trusted alone).
                            warn!(lease = %self.lease, ?seen, "the leader Lease is no longer this replica's: stepping down");
                            elected.send_replace(false);
                            manager = None;
                        }
                    } else if matches!(seen, Seen::Free | Seen::Deleted) {
                        // A fresh manager reads it (creating it again if it is gone) and takes
                        // a free Lease at once.
                        debug!(lease = %self.lease, ?seen, "the leader Lease is free: trying to take it now");
                        manager = None;
                    }
                }
            }
        }
        match manager {
            Some(current) => {
                drop(current.changed);
                current.manager.release().await
            }
            None => Ok(()),
        }
    }
}

/// What the manager says next, as a future.
type Changed = Pin<Box<dyn Future<Output = Result<bool, LeaseManagerError>> + Send>>;

/// The election's manager and its call of [`LeaseManager::changed`] under way, kept from one turn
/// of [`Election::run`]'s loop to the next until it returns. Dropped at each event of the Lease
/// watch, as it was once, the call was cut between a renewal's write and its read of the Lease
/// back: the manager kept the expiry of the renewal before, which was due again at once, and
/// the new renewal's own event cut that one too: a leader renewed its Lease about 13 times a
/// second, for as long as it led.
struct Current {
    manager: Arc<LeaseManager>,
    changed: Changed,
}

impl Current {
    fn new(manager: LeaseManager) -> Self {
        let manager = Arc::new(manager);
        let changed = Self::call(&manager);
        Self { manager, changed }
    }

    fn call(manager: &Arc<LeaseManager>) -> Changed {
        let manager = manager.clone();
        Box::pin(async move { manager.changed().await })
    }

    /// Calls [`LeaseManager::changed`] again, the last call having returned.
    fn again(&mut self) {
        self.changed = Self::call(&self.manager);
    }
}

/// Waits before election attempt number `failures` + 1: 1 s doubling to 30 s for a standby,
/// 1 s for a leader (well within its renewal grace); returns whether `stop` came first.
async fn pause(failures: u32, leading: bool, stop: &CancellationToken) -> bool {
    let wait = if leading {
        Duration::from_secs(1)
    } else {
        Duration::from_secs(1 << (failures.clamp(1, 6) - 1)).min(Duration::from_secs(30))
    };
    tokio::select! {
        () = stop.cancelled() => true,
        () = tokio::time::sleep(wait) => false,
    }
}

/// What the watch of the leader Lease shows.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Seen {
    /// Held by the identity it names (taken or renewed).
    HeldBy(String),
    /// No holder: the leader released it (or it was never taken).
    Free,
    /// Deleted: nobody can renew it, and a fresh manager creates it again.
    Deleted,
}

/// What the Lease `name` shows at each change; watch failures are logged and retried.
fn lease_seen(leases: Api<Lease>, name: &str) -> impl Stream<Item = Seen> + Send + use<> {
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    watcher::watcher(leases, config)
        .default_backoff()
        .filter_map(|event| async move {
            match event {
                Ok(watcher::Event::Apply(lease) | watcher::Event::InitApply(lease)) => Some(
                    lease
                        .spec
                        .and_then(|spec| spec.holder_identity)
                        .filter(|holder| !holder.is_empty())
                        .map_or(Seen::Free, Seen::HeldBy),
                ),
                Ok(watcher::Event::Delete(_)) => Some(Seen::Deleted),
                Ok(_) => None,
                Err(e) => {
                    warn!(error = %e, "cannot watch the leader Lease; a standby takes it over only when it expires");
                    None
                }
            }
        })
}

/// Mirrors the election result; on gaining leadership, settles for `settle` before placing
/// anyone ([`Registry::settle`]); on losing it, drops every registration.
pub(crate) async fn follow_leadership(
    mut elected: watch::Receiver<bool>,
    leading: watch::Sender<bool>,
    (registry, settle): (Arc<Registry>, Duration),
    stop: CancellationToken,
) {
    let mut settled_at = None;
    loop {
        let now = *elected.borrow_and_update();
        if now != *leading.borrow() {
            if now {
                info!(
                    ?settle,
                    "leading: placing the replicas once they have registered again with the dispatchers they poll"
                );
                registry.settle();
                settled_at = Some(tokio::time::Instant::now() + settle);
            } else {
                warn!(
                    "not leading any more: dropping registrations, replicas re-register with the leader"
                );
                registry.clear();
                settled_at = None;
            }
            leading.send_replace(now);
        }
        tokio::select! {
            () = stop.cancelled() => break,
            changed = elected.changed() => if changed.is_err() { break },
            () = tokio::time::sleep_until(settled_at.unwrap_or_else(tokio::time::Instant::now)), if settled_at.is_some() => {
                settled_at = None;
                registry.settled();
            }
        }
    }
    registry.clear();
    leading.send_replace(false);
}
