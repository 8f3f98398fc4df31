//! Where a replica finds dispatchers while no load balancer answers: the dispatchers' headless
//! Service, looked up while registration has failed for [`FALLBACK_AFTER`].
//!
//! Placement by the load balancer is about balance only; the dispatchers keep every key to one
//! replica at a time whoever polls them. So a replica that cannot register (no load balancer
//! leads: a rolling update of the load balancers, both of its pods lost) may poll dispatchers it
//! found itself. It keeps the dispatchers assigned last and adds those the Service names, never
//! dropping one (at most [`MOST_FOUND`], so a long outage that churns many pod addresses stops
//! adding), until an assignment replaces them all. Its registrations name only the dispatchers
//! assigned last, so a new leader keeps what it can of the last placement.
//!
//! One dispatcher polled under two spellings would have this replica's two sessions there
//! replace each other. What an assigned name stands for is not added; a dual-stack Service,
//! which names each pod by an IPv4 and an IPv6 address, would still be polled twice per pod:
//! keep the dispatcher Service single-stack, as `deploy/` installs it.

use std::{
    collections::{BTreeSet, HashSet},
    fmt,
    future::Future,
    net::SocketAddr,
    pin::Pin,
    sync::Arc,
    time::Duration,
};

use tokio::{sync::watch, time::Instant};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

/// How long registration must have failed before a replica looks up the dispatcher Service:
/// longer than a standby takes to lead after a clean stop, so a rolling update of the load
/// balancers, which hands over within a second, never gets here.
pub(crate) const FALLBACK_AFTER: Duration = Duration::from_secs(10);

/// How often the Service is looked up again while registration still fails.
const RESOLVE_EVERY: Duration = Duration::from_secs(5);

/// How long one lookup may take before it is abandoned until the next.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);

/// Most dispatchers a replica adds from the Service, all lookups together: as many as the load
/// balancer reads of a registration.
const MOST_FOUND: usize = 64;

/// What a lookup of a name returns: the socket addresses it stands for.
type Lookup = Pin<Box<dyn Future<Output = std::io::Result<Vec<SocketAddr>>> + Send>>;

type Resolver = Arc<dyn Fn(&str) -> Lookup + Send + Sync>;

/// The dispatchers' headless Service (`host:port`), which a replica looks up while it cannot
/// register with the load balancer. `deploy/` installs it as
/// `kube-dispatch-dispatcher.kube-dispatch.svc:7070`, publishing pods that are not Ready too,
/// and its controllers set it in `KD_DISPATCHER_SERVICE`. The addresses it returns are dialled
/// as the load balancer's are, by IP and port, verified under the dispatchers' server name
/// (`KD_TLS_SERVER_NAME`).
#[derive(Clone)]
pub struct DispatcherService {
    name: String,
    resolve: Resolver,
}

impl DispatcherService {
    /// The Service at `name` (`host:port`), looked up in DNS.
    pub fn dns(name: impl Into<String>) -> Self {
        Self::with_resolver(name, |name: &str| {
            let name = name.to_owned();
            async move { Ok(tokio::net::lookup_host(name).await?.collect()) }
        })
    }

    /// The Service at `name`, looked up by `resolve` (given `name`, or a dispatcher's address
    /// from an assignment when that is not an IP address): for tests, and for discovery other
    /// than DNS.
    pub fn with_resolver<F, Fut>(name: impl Into<String>, resolve: F) -> Self
    where
        F: Fn(&str) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::io::Result<Vec<SocketAddr>>> + Send + 'static,
    {
        Self {
            name: name.into(),
            resolve: Arc::new(move |name| Box::pin(resolve(name))),
        }
    }

    /// The Service named by `KD_DISPATCHER_SERVICE`, if set and not empty.
    pub(crate) fn from_env() -> Option<Self> {
        std::env::var("KD_DISPATCHER_SERVICE")
            .ok()
            .filter(|name| !name.trim().is_empty())
            .map(|name| Self::dns(name.trim()))
    }

    /// Whether the name is `host:port`, as a lookup needs it.
    fn has_port(&self) -> bool {
        self.name
            .rsplit_once(':')
            .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok())
    }

    /// The socket addresses `name` stands for: itself when it is one, else what the resolver
    /// says within [`RESOLVE_TIMEOUT`].
    async fn lookup(&self, name: &str) -> std::io::Result<Vec<SocketAddr>> {
        if let Ok(address) = name.parse::<SocketAddr>() {
            return Ok(vec![address]);
        }
        tokio::time::timeout(RESOLVE_TIMEOUT, (self.resolve)(name))
            .await
            .unwrap_or_else(|_| {
                Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no answer within {RESOLVE_TIMEOUT:?}"),
                ))
            })
    }
}

impl fmt::Debug for DispatcherService {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DispatcherService")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// Where the registration stands: the dispatchers assigned last, how many assignments came
/// (so that one followed at once by a failure is not missed by a reader that sees only the
/// latest state), and whether a registration stream that delivered an assignment is open now.
#[derive(Clone, Debug, Default)]
pub(crate) struct Registration {
    pub(crate) dispatchers: BTreeSet<String>,
    pub(crate) assignments: u64,
    pub(crate) registered: bool,
}

impl Registration {
    /// Takes an assignment: the registration works.
    pub(crate) fn assigned(&mut self, dispatchers: BTreeSet<String>) {
        self.dispatchers = dispatchers;
        self.assignments += 1;
        self.registered = true;
    }
}

/// The dispatchers found in the Service beyond those assigned.
#[derive(Debug, Default)]
struct Found(BTreeSet<String>);

impl Found {
    /// Adds the addresses of `resolved` that are neither assigned (as spelled, nor as any
    /// address an assigned name stands for: one dispatcher polled under two spellings would have
    /// its two sessions of this replica replace each other) nor found already, up to
    /// [`MOST_FOUND`] in all. Returns those added.
    fn add(
        &mut self,
        resolved: &[SocketAddr],
        assigned: &BTreeSet<String>,
        assigned_as: &HashSet<SocketAddr>,
    ) -> Vec<String> {
        let mut added = Vec::new();
        for address in resolved {
            let spelled = address.to_string();
            if self.0.len() >= MOST_FOUND {
                break;
            }
            if assigned_as.contains(address)
                || assigned.contains(&spelled)
                || !self.0.insert(spelled.clone())
            {
                continue;
            }
            added.push(spelled);
        }
        added
    }

    /// What the replica polls: the dispatchers assigned last and those found.
    fn targets(&self, assigned: &BTreeSet<String>) -> BTreeSet<String> {
        assigned.union(&self.0).cloned().collect()
    }
}

/// A lookup under way: started for the assignment counted `for_assignments`.
struct Pending {
    for_assignments: u64,
    lookup: Pin<Box<dyn Future<Output = Option<Resolved>> + Send>>,
}

/// What a lookup found: the Service's addresses, and those the assigned names stand for.
type Resolved = (Vec<SocketAddr>, HashSet<SocketAddr>);

/// Publishes on `targets` what the replica polls: each assignment as it comes, and, while
/// registration has failed for [`FALLBACK_AFTER`], the dispatchers `service` names besides,
/// looked up every [`RESOLVE_EVERY`]. Until `stop`, or until the registration ends for good.
/// A lookup runs beside the rest: an assignment that comes meanwhile is taken at once, and
/// the lookup's result dropped.
pub(crate) async fn keep_targets(
    mut registration: watch::Receiver<Registration>,
    service: Option<DispatcherService>,
    targets: &watch::Sender<BTreeSet<String>>,
    stop: &CancellationToken,
) {
    let service = service.filter(|service| {
        if !service.has_port() {
            error!(service = %service.name, "the dispatcher Service must be host:port (KD_DISPATCHER_SERVICE); not looked up");
        }
        service.has_port()
    });
    if let Some(service) = &service {
        info!(service = %service.name, after = ?FALLBACK_AFTER, "the dispatcher Service is looked up while no load balancer answers");
    }
    let mut found = Found::default();
    let mut assignments = 0;
    // Not registered yet: a replica that starts while no load balancer leads finds its
    // dispatchers too. When the Service is looked up next: FALLBACK_AFTER into a failure, then
    // every RESOLVE_EVERY; never while registered.
    let mut failing_since = Some(Instant::now());
    let mut next_lookup = failing_since.map(|since| since + FALLBACK_AFTER);
    let mut pending: Option<Pending> = None;
    loop {
        let lookup_at = next_lookup.filter(|_| service.is_some() && pending.is_none());
        tokio::select! {
            () = stop.cancelled() => return,
            changed = registration.changed() => {
                if changed.is_err() {
                    return;
                }
                let now = registration.borrow_and_update().clone();
                if now.assignments != assignments {
                    // An assignment, even one that failed since: it replaces what was found,
                    // and a failure after it waits FALLBACK_AFTER again.
                    assignments = now.assignments;
                    pending = None;
                    failing_since = None;
                    next_lookup = None;
                    if !found.0.is_empty() {
                        info!(found = ?found.0, "assigned again: polling what the load balancer assigns, not what the Service named");
                        found.0.clear();
                    }
                }
                if now.registered {
                    failing_since = None;
                    next_lookup = None;
                } else if failing_since.is_none() {
                    let since = Instant::now();
                    failing_since = Some(since);
                    next_lookup = Some(since + FALLBACK_AFTER);
                }
                targets.send_if_modified(|t| replace(t, found.targets(&now.dispatchers)));
            }
            () = sleep_until(lookup_at) => {
                next_lookup = Some(Instant::now() + RESOLVE_EVERY);
                if let Some(service) = &service {
                    let assigned = registration.borrow().dispatchers.clone();
                    pending = Some(Pending {
                        for_assignments: assignments,
                        lookup: Box::pin(resolve(service.clone(), assigned)),
                    });
                }
            }
            resolved = async { pending.as_mut().expect("enabled only while pending").lookup.as_mut().await }, if pending.is_some() => {
                let started_for = pending.take().map(|p| p.for_assignments);
                let now = registration.borrow().clone();
                // A lookup started before the last assignment, or finished after a new one
                // came (seen next time round), is dropped.
                let (Some((addresses, assigned_as)), Some(service)) = (resolved, &service) else { continue };
                if now.registered || now.assignments != assignments || started_for != Some(assignments) {
                    continue;
                }
                let added = found.add(&addresses, &now.dispatchers, &assigned_as);
                if !added.is_empty() {
                    warn!(service = %service.name, ?added, failing_for = ?failing_since.map(|s| s.elapsed()), "no load balancer answers: polling dispatchers found in the Service besides those assigned last");
                }
                targets.send_if_modified(|t| replace(t, found.targets(&now.dispatchers)));
            }
        }
    }
}

/// Looks up `service`, and the addresses the names among `assigned` stand for. `None` when the
/// Service could not be looked up (logged). Each lookup is bounded by [`RESOLVE_TIMEOUT`]; a
/// DNS lookup abandoned then still holds one of the runtime's blocking threads until the
/// system resolver gives up, and at most one lookup is started every [`RESOLVE_EVERY`].
async fn resolve(service: DispatcherService, assigned: BTreeSet<String>) -> Option<Resolved> {
    let addresses = service.lookup(&service.name).await;
    let addresses = match addresses {
        Ok(addresses) => addresses,
        Err(error) => {
            warn!(service = %service.name, %error, "cannot look up the dispatcher Service; polling the dispatchers assigned last");
            return None;
        }
    };
    let mut assigned_as = HashSet::new();
    for name in &assigned {
        // A name that cannot be looked up is not polled either; it aliases nothing.
        if let Ok(resolved) = service.lookup(name).await {
            assigned_as.extend(resolved);
        }
    }
    Some((addresses, assigned_as))
}

/// Sleeps until `at`, or for ever.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Sets `targets` to `new`; whether that changed it.
fn replace(targets: &mut BTreeSet<String>, new: BTreeSet<String>) -> bool {
    if *targets == new {
        return false;
    }
    *targets = new;
    true
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    fn set(addresses: &[&str]) -> BTreeSet<String> {
        addresses.iter().map(|a| (*a).to_owned()).collect()
    }

    fn addr(address: &str) -> SocketAddr {
        address.parse().expect("a socket address")
    }

    #[test]
    fn the_service_adds_neither_an_assigned_dispatcher_nor_one_under_another_spelling() {
        let assigned = set(&["10.0.0.1:7070", "dispatcher-1.example:7070"]);
        // The assigned name stands for 10.0.0.2.
        let assigned_as = HashSet::from([addr("10.0.0.1:7070"), addr("10.0.0.2:7070")]);
        let mut found = Found::default();
        let resolved = [
            addr("10.0.0.1:7070"),
            addr("10.0.0.2:7070"),
            addr("10.0.0.3:7070"),
        ];
        assert_eq!(
            found.add(&resolved, &assigned, &assigned_as),
            ["10.0.0.3:7070"]
        );
        // Found once, added once.
        assert!(found.add(&resolved, &assigned, &assigned_as).is_empty());
        assert_eq!(
            found.targets(&assigned),
            set(&[
                "10.0.0.1:7070",
                "10.0.0.3:7070",
                "dispatcher-1.example:7070"
            ])
        );
    }

    #[test]
    fn a_service_without_a_port_is_not_looked_up() {
        assert!(!DispatcherService::dns("kube-dispatch-dispatcher.kube-dispatch.svc").has_port());
        assert!(!DispatcherService::dns(":7070").has_port());
        assert!(!DispatcherService::dns("dispatchers:http").has_port());
        assert!(
            DispatcherService::dns("kube-dispatch-dispatcher.kube-dispatch.svc:7070").has_port()
        );
        assert!(DispatcherService::dns("[::1]:7070").has_port());
    }

    #[test]
    fn the_service_adds_at_most_64_dispatchers() {
        let mut found = Found::default();
        let many: Vec<SocketAddr> = (0..100u16)
            .map(|i| SocketAddr::from(([10, 0, 0, 1], 7000 + i)))
            .collect();
        assert_eq!(
            found.add(&many, &BTreeSet::new(), &HashSet::new()).len(),
            MOST_FOUND
        );
        assert!(
            found
                .add(&[addr("10.9.9.9:7070")], &BTreeSet::new(), &HashSet::new())
                .is_empty()
        );
        assert_eq!(found.0.len(), MOST_FOUND);
    }

    /// [`keep_targets`] running with `service` until `stop`: its registration to feed, what it
    /// publishes, and its task.
    struct Kept {
        registration: watch::Sender<Registration>,
        polled: watch::Receiver<BTreeSet<String>>,
        keep: tokio::task::JoinHandle<()>,
    }

    fn kept(service: DispatcherService, stop: &CancellationToken) -> Kept {
        let (registration, registered) = watch::channel(Registration::default());
        let (targets, polled) = watch::channel(BTreeSet::new());
        let stop = stop.clone();
        let keep = tokio::spawn(async move {
            keep_targets(registered, Some(service), &targets, &stop).await;
        });
        Kept {
            registration,
            polled,
            keep,
        }
    }

    /// A resolver that names `addresses` and records when it was asked.
    fn service(addresses: &[&str], asked: &Arc<Mutex<Vec<Instant>>>) -> DispatcherService {
        let addresses: Vec<SocketAddr> = addresses.iter().map(|a| addr(a)).collect();
        let asked = asked.clone();
        DispatcherService::with_resolver("dispatchers.test:7070", move |name: &str| {
            assert_eq!(name, "dispatchers.test:7070");
            asked.lock().unwrap().push(Instant::now());
            let addresses = addresses.clone();
            async move { Ok(addresses) }
        })
    }

    /// Registration fails from the start: the replica polls what the Service names once
    /// registration has failed for 10 s, not before; an assignment then replaces it all, and a
    /// registration that fails again adds the Service's dispatchers again, never dropping the
    /// assigned ones.
    #[tokio::test(start_paused = true)]
    async fn the_service_is_polled_only_while_registration_has_failed_for_a_while() {
        let stop = CancellationToken::new();
        let asked = Arc::default();
        let service = service(&["10.0.0.1:7070", "10.0.0.2:7070"], &asked);
        let started = Instant::now();
        let Kept {
            registration,
            mut polled,
            keep,
        } = kept(service, &stop);
        let found = polled
            .wait_for(|t| !t.is_empty())
            .await
            .expect("published")
            .clone();
        assert_eq!(found, set(&["10.0.0.1:7070", "10.0.0.2:7070"]));
        let waited = started.elapsed();
        assert!(
            (FALLBACK_AFTER..FALLBACK_AFTER + RESOLVE_EVERY).contains(&waited),
            "looked up after {waited:?}"
        );
        assert!(
            asked
                .lock()
                .unwrap()
                .iter()
                .all(|at| *at >= started + FALLBACK_AFTER)
        );

        // Registered: the assignment is all that is polled, and the Service is left alone.
        registration.send_modify(|r| r.assigned(set(&["10.0.0.2:7070"])));
        let assigned = polled
            .wait_for(|t| t.len() == 1)
            .await
            .expect("published")
            .clone();
        assert_eq!(assigned, set(&["10.0.0.2:7070"]));
        let lookups = asked.lock().unwrap().len();
        tokio::time::sleep(FALLBACK_AFTER * 3).await;
        assert_eq!(asked.lock().unwrap().len(), lookups);

        // The registration ends: the assignment stays, and the Service is added 10 s later.
        let failed = Instant::now();
        registration.send_modify(|r| r.registered = false);
        let again = polled
            .wait_for(|t| t.len() == 2)
            .await
            .expect("published")
            .clone();
        assert_eq!(again, set(&["10.0.0.1:7070", "10.0.0.2:7070"]));
        assert!(failed.elapsed() >= FALLBACK_AFTER);
        stop.cancel();
        keep.await.expect("ends on stop");
    }

    /// An assignment followed at once by a failure, which a reader sees as one change, still
    /// replaces what the Service named, and the failure waits the fallback time again.
    #[tokio::test(start_paused = true)]
    async fn an_assignment_that_fails_at_once_still_replaces_what_was_found() {
        let stop = CancellationToken::new();
        let asked = Arc::default();
        let service = service(&["10.0.0.1:7070", "10.0.0.2:7070"], &asked);
        let Kept {
            registration,
            mut polled,
            keep,
        } = kept(service, &stop);
        polled
            .wait_for(|t| t.len() == 2)
            .await
            .expect("the Service's dispatchers");
        let assigned_at = Instant::now();
        registration.send_modify(|r| {
            r.assigned(set(&["10.0.0.3:7070"]));
            r.registered = false;
        });
        let now = polled
            .wait_for(|t| !t.contains("10.0.0.1:7070"))
            .await
            .expect("published")
            .clone();
        assert_eq!(now, set(&["10.0.0.3:7070"]));
        let again = polled
            .wait_for(|t| t.len() == 3)
            .await
            .expect("published")
            .clone();
        assert_eq!(
            again,
            set(&["10.0.0.1:7070", "10.0.0.2:7070", "10.0.0.3:7070"])
        );
        assert!(assigned_at.elapsed() >= FALLBACK_AFTER);
        stop.cancel();
        keep.await.expect("ends on stop");
    }

    /// A lookup that hangs (DNS down with the load balancer) holds up no assignment, and its
    /// result, when it comes, is not added once an assignment came meanwhile.
    #[tokio::test(start_paused = true)]
    async fn an_assignment_is_taken_while_a_lookup_hangs() {
        let stop = CancellationToken::new();
        let answer = Arc::new(tokio::sync::Notify::new());
        let service = {
            let answer = answer.clone();
            DispatcherService::with_resolver("dispatchers.test:7070", move |_: &str| {
                let answer = answer.clone();
                async move {
                    answer.notified().await;
                    Ok(vec![addr("10.0.0.9:7070")])
                }
            })
        };
        let Kept {
            registration,
            mut polled,
            keep,
        } = kept(service, &stop);
        // The lookup starts at FALLBACK_AFTER and hangs; the assignment comes a second later.
        tokio::time::sleep(FALLBACK_AFTER + Duration::from_secs(1)).await;
        let sent = Instant::now();
        registration.send_modify(|r| r.assigned(set(&["10.0.0.2:7070"])));
        polled
            .wait_for(|t| t.contains("10.0.0.2:7070"))
            .await
            .expect("published");
        assert!(
            sent.elapsed() < Duration::from_millis(10),
            "held up {:?}",
            sent.elapsed()
        );
        answer.notify_waiters();
        tokio::time::sleep(RESOLVE_EVERY * 3).await;
        assert_eq!(*polled.borrow(), set(&["10.0.0.2:7070"]));
        stop.cancel();
        keep.await.expect("ends on stop");
    }
}
