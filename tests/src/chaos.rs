//! The chaos suite: the whole tier (dispatchers, two load balancers, controller replicas) in
//! this process against the real API server, a writer that creates, updates and deletes
//! ConfigMaps and Widgets (with owned ConfigMaps) across two namespaces, and faults injected
//! at random from a seed. The journal then proves the delivery contract: nothing lost, no key
//! reconciled by two replicas at once.
//!
//! Here: the world, its faults and their schedule; the journal (`journal.rs`) and the fault
//! proxy (`faultproxy.rs`) are apart.
//!
//! Every network path a fault can hit goes through a [`FaultProxy`]: controllers reach each
//! dispatcher through one (its Lease advertises the proxy), each dispatcher reaches the API
//! server through one, and the load balancers sit behind one that plays their Service.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    sync::Arc,
    time::Duration,
};

use futures::StreamExt;
use k8s_openapi::api::{coordination::v1::Lease, core::v1::ConfigMap};
use kube::{
    Api, Resource, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams},
};
use kube_dispatch_controller::{Action, Controller};
use kube_dispatch_dispatcher::config::ServeConfig;
use rand::{RngExt, SeedableRng, rngs::StdRng};
use tokio::{sync::Mutex, time::Instant};
use tokio_util::sync::CancellationToken;

use crate::{
    Cluster, FixtureError, TestNamespace, Widget,
    dispatcher::{TestDispatcher, lease_membership, test_config},
    ensure_widget_crd,
    faultproxy::{Fault, FaultProxy},
    isolated::Isolated,
    journal::Journal,
    loadbalancer::TestLoadBalancer,
};

type Failure = Box<dyn std::error::Error + Send + Sync>;

/// `T` of the chaos dispatchers (their longest session ttl and reconcile time).
const BOUND: Duration = Duration::from_secs(3);
/// Session ttl of the chaos replicas.
const TTL: Duration = Duration::from_secs(3);
const REPLICAS: usize = 3;
const DISPATCHERS: usize = 3;
/// `--idle-group-grace` of the chaos dispatchers: longer than a controller's sessions can be
/// away in any fault but the one that keeps every replica away past it (a cut of up to 3.5 s,
/// then reconnect backoff of up to about 6 s).
const IDLE_GRACE: Duration = Duration::from_secs(12);

/// What a chaos run does.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Seeds the fault schedule and the writer.
    pub seed: u64,
    /// How long faults are injected.
    pub duration: Duration,
    /// Objects per kind and namespace.
    pub objects: usize,
    /// One write every this long.
    pub write_period: Duration,
    /// The fault kinds to draw from (numbers below [`FAULT_KINDS`], as `inject` lists them);
    /// empty for all of them.
    pub faults: Vec<u32>,
}

/// How many kinds of fault `inject` knows.
pub const FAULT_KINDS: u32 = 19;

impl Settings {
    /// The short mode: 40 s of faults over 12 objects per kind and namespace, a write every
    /// 40 ms.
    pub fn short(seed: u64) -> Self {
        Self {
            seed,
            duration: Duration::from_secs(40),
            objects: 12,
            write_period: Duration::from_millis(40),
            faults: Vec::new(),
        }
    }
}

/// A fault as injected.
#[derive(Clone, Debug)]
pub struct Injected {
    /// What it was.
    pub what: String,
    /// When it began and ended (healed).
    pub from: Instant,
    /// When it was healed.
    pub to: Instant,
    /// The longest a write made while it was in force (or within a second after) waited for
    /// its reconcile.
    pub recovery: Duration,
}

/// The checker's verdict on a run.
#[derive(Debug)]
pub struct Report {
    /// The seed.
    pub seed: u64,
    /// Writes made (creates, updates, deletes, owned-object writes).
    pub writes: usize,
    /// Reconciles run.
    pub reconciles: usize,
    /// Final states never followed by a reconcile.
    pub lost: Vec<String>,
    /// Deletions never followed by a reconcile, of keys whose last reconcile already saw them
    /// deleted and whose later versions no reconcile saw: created and deleted again unseen, so
    /// the controllers' last view is the final state. Not a loss under the level-triggered
    /// contract (`CONTRACT.md`, section 1), counted apart to keep it in sight.
    pub unseen: Vec<String>,
    /// Of those, deletions of a key of a dispatcher that was killed around then, reported apart
    /// to point at the path that lost them (the peers' memory of recent deletions,
    /// `dispatcher/HANDOVER.md`).
    pub lost_in_crash_window: Vec<String>,
    /// Pairs of reconciles of one key that overlapped.
    pub concurrent: usize,
    /// Each of those pairs: the key, both reconciles (replica, resourceVersion, start and end
    /// since the run began) and the faults around them.
    pub overlapping: Vec<String>,
    /// The faults, in order.
    pub faults: Vec<Injected>,
    /// From the end of the faults until every final state was reconciled.
    pub settle: Duration,
}

impl Report {
    /// The column names of [`Report::line`].
    pub const LINE_HEADER: &'static str = "seed                   faults  writes  reconciles  lost  lost-in-crash  concurrent  unseen";

    /// Whether nothing was lost and no reconciles overlapped.
    pub fn clean(&self) -> bool {
        self.lost.is_empty() && self.lost_in_crash_window.is_empty() && self.concurrent == 0
    }

    /// One line: seed, faults, writes, reconciles, lost, lost in a crash window, concurrent,
    /// deletions unseen.
    pub fn line(&self) -> String {
        format!(
            "{:<22} {:>6}  {:>6}  {:>10}  {:>4}  {:>13}  {:>10}  {:>6}",
            self.seed,
            self.faults.len(),
            self.writes,
            self.reconciles,
            self.lost.len(),
            self.lost_in_crash_window.len(),
            self.concurrent,
            self.unseen.len()
        )
    }
}

/// The sums of several runs' reports, for the soak mode.
#[derive(Debug, Default)]
pub struct Totals {
    /// Runs added.
    pub runs: usize,
    /// Runs with anything lost or overlapping.
    pub failed: usize,
    /// Faults injected.
    pub faults: usize,
    /// Writes made.
    pub writes: usize,
    /// Reconciles run.
    pub reconciles: usize,
    /// Final states never reconciled (lost in a crash window included).
    pub lost: usize,
    /// Overlapping pairs of reconciles of one key.
    pub concurrent: usize,
    /// Deletions created and deleted again unseen ([`Report::unseen`]).
    pub unseen: usize,
}

impl Totals {
    /// Adds one run.
    pub fn add(&mut self, report: &Report) {
        self.runs += 1;
        self.failed += usize::from(!report.clean());
        self.faults += report.faults.len();
        self.writes += report.writes;
        self.reconciles += report.reconciles;
        self.lost += report.lost.len() + report.lost_in_crash_window.len();
        self.concurrent += report.concurrent;
        self.unseen += report.unseen.len();
    }
}

impl fmt::Display for Totals {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "total: {} runs ({} failed), {} faults, {} writes, {} reconciles, lost {}, concurrent {}, deletions unseen {}",
            self.runs,
            self.failed,
            self.faults,
            self.writes,
            self.reconciles,
            self.lost,
            self.concurrent,
            self.unseen
        )
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "chaos run, seed {}", self.seed)?;
        writeln!(f, "  {:<44} {}", "writes", self.writes)?;
        writeln!(
            f,
            "  {:<44} {} ({:.2} per write)",
            "reconciles",
            self.reconciles,
            self.reconciles as f64 / self.writes.max(1) as f64
        )?;
        writeln!(f, "  {:<44} {}", "lost", self.lost.len())?;
        for l in self.lost.iter().chain(&self.lost_in_crash_window) {
            writeln!(f, "    {l}")?;
        }
        writeln!(
            f,
            "  {:<44} {}",
            "deletions lost while their dispatcher was down",
            self.lost_in_crash_window.len()
        )?;
        writeln!(f, "  {:<44} {}", "concurrent", self.concurrent)?;
        for o in &self.overlapping {
            writeln!(f, "    {o}")?;
        }
        writeln!(
            f,
            "  {:<44} {}",
            "created and deleted again unseen",
            self.unseen.len()
        )?;
        for u in &self.unseen {
            writeln!(f, "    {u}")?;
        }
        writeln!(
            f,
            "  {:<44} {:.1?}",
            "all final states reconciled after the faults", self.settle
        )?;
        writeln!(
            f,
            "  faults ({}), recovery = longest write-to-reconcile delay while in force:",
            self.faults.len()
        )?;
        let mut by_kind: BTreeMap<&str, (usize, Duration)> = BTreeMap::new();
        for fault in &self.faults {
            let kind = fault.what.split(' ').next().unwrap_or_default();
            let e = by_kind.entry(kind).or_default();
            e.0 += 1;
            e.1 = e.1.max(fault.recovery);
        }
        for fault in &self.faults {
            writeln!(
                f,
                "    {:<46} held {:>5.1?}  recovery {:>5.1?}",
                fault.what,
                fault.to.saturating_duration_since(fault.from),
                fault.recovery
            )?;
        }
        writeln!(f, "  by kind (count, worst recovery):")?;
        for (kind, (n, worst)) in by_kind {
            writeln!(f, "    {kind:<20} {n:>3}  {worst:>5.1?}")?;
        }
        Ok(())
    }
}

struct DispatcherSlot {
    running: Option<TestDispatcher>,
    /// Controllers to dispatcher.
    front: FaultProxy,
    /// Dispatcher to API server.
    api: FaultProxy,
}

struct World {
    namespaces: Vec<TestNamespace>,
    label: String,
    journal: Journal,
    dispatchers: BTreeMap<usize, DispatcherSlot>,
    balancers: Vec<Option<TestLoadBalancer>>,
    /// The load balancers' Service: forwards to a live one.
    service: FaultProxy,
    replicas: BTreeMap<String, Option<Isolated>>,
    apiserver: std::net::SocketAddr,
    /// Objects per kind and namespace ([`Settings::objects`]).
    objects: usize,
}

impl World {
    fn lease_namespace(&self) -> String {
        self.namespaces[0].name().to_owned()
    }

    fn config(&self, i: usize) -> ServeConfig {
        let name = format!("dispatcher-{i}");
        let mut config = test_config(&name, &[]);
        config.membership = lease_membership(&self.lease_namespace(), &name, BOUND);
        config.settings.limits.max_ttl = BOUND;
        config.settings.queue.max_reconcile_time = BOUND;
        config.drain_timeout = Duration::from_secs(5);
        config.settings.idle_group_grace = IDLE_GRACE;
        config
    }

    async fn start_dispatcher(&mut self, i: usize) -> Result<(), Failure> {
        if !self.dispatchers.contains_key(&i) {
            let slot = DispatcherSlot {
                running: None,
                front: FaultProxy::start(self.apiserver).await?,
                api: FaultProxy::start(self.apiserver).await?,
            };
            self.dispatchers.insert(i, slot);
        }
        let config = self.config(i);
        let Some(slot) = self.dispatchers.get_mut(&i) else {
            return Ok(());
        };
        let d = TestDispatcher::start_with(
            config,
            "127.0.0.1:0",
            Some(slot.api.addr),
            Some(slot.front.addr.to_string()),
        )
        .await?;
        slot.front.retarget(d.addr);
        slot.running = Some(d);
        Ok(())
    }

    async fn start_balancer(&mut self, i: usize) -> Result<(), Failure> {
        let lb = TestLoadBalancer::start(&self.lease_namespace()).await?;
        if self.balancers.iter().flatten().count() == 0 {
            self.service.retarget(lb.addr);
        }
        self.balancers[i] = Some(lb);
        Ok(())
    }

    fn start_replica(&mut self, name: &str) -> Result<(), Failure> {
        let replica = start_checker(name, &self.label, self.service.addr, &self.journal)?;
        self.replicas.insert(name.to_owned(), Some(replica));
        Ok(())
    }

    /// Brings every component back and heals every proxy.
    async fn heal_all(&mut self) -> Result<(), Failure> {
        for slot in self.dispatchers.values() {
            slot.front.set(Fault::None);
            slot.api.set(Fault::None);
        }
        for i in 0..DISPATCHERS {
            if self.dispatchers.get(&i).is_none_or(|s| s.running.is_none()) {
                self.start_dispatcher(i).await?;
            }
        }
        for i in 0..self.balancers.len() {
            if self.balancers[i].is_none() {
                self.start_balancer(i).await?;
            }
        }
        let names: Vec<String> = self.replicas.keys().cloned().collect();
        for name in names {
            if self.replicas.get(&name).is_some_and(Option::is_none) {
                self.start_replica(&name)?;
            }
        }
        Ok(())
    }

    async fn stop_all(&mut self) {
        for (_, r) in std::mem::take(&mut self.replicas) {
            if let Some(r) = r {
                r.stop().await;
            }
        }
        for (_, slot) in std::mem::take(&mut self.dispatchers) {
            if let Some(d) = slot.running {
                d.stop().await;
            }
        }
        for lb in self.balancers.iter_mut() {
            if let Some(lb) = lb.take() {
                lb.stop().await;
            }
        }
    }
}

/// Runs the tier under seeded faults for `settings.duration` and returns the checker's report.
pub async fn run(settings: Settings) -> Result<Report, Failure> {
    let client = Cluster::shared().client().await?;
    ensure_widget_crd(&client).await?;
    let namespaces = vec![
        TestNamespace::create(&format!("chaos-{}-a", settings.seed)).await?,
        TestNamespace::create(&format!("chaos-{}-b", settings.seed)).await?,
    ];
    let label = format!("kube-dispatch.dev/chaos={}", namespaces[0].name());
    let apiserver = Cluster::shared().apiserver_addr().await?;
    let mut world = World {
        label,
        journal: Journal::default(),
        dispatchers: BTreeMap::new(),
        balancers: vec![None, None],
        service: FaultProxy::start(apiserver).await?,
        replicas: BTreeMap::new(),
        apiserver,
        namespaces,
        objects: settings.objects,
    };
    for i in 0..DISPATCHERS {
        world.start_dispatcher(i).await?;
    }
    world.start_balancer(0).await?;
    world.start_balancer(1).await?;
    for j in 0..REPLICAS {
        world.start_replica(&format!("replica-{j}"))?;
    }

    let began = Instant::now();
    let stop = CancellationToken::new();
    let writer = Writer::new(&world, settings.seed, settings.objects);
    let state = writer.state.clone();
    let writing = tokio::spawn(writer.run(settings.write_period, stop.clone()));
    // Faults begin once every object was created and reconciled (two kinds in two namespaces).
    let created = 4 * settings.objects;
    let deadline = Instant::now() + Duration::from_secs(60);
    while world.journal.len() < created {
        if Instant::now() >= deadline {
            return Err(format!(
                "only {} of {created} creations reconciled",
                world.journal.len()
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let mut rng = StdRng::seed_from_u64(settings.seed);
    let deadline = Instant::now() + settings.duration;
    let mut faults = Vec::new();
    while Instant::now() < deadline {
        let from = Instant::now();
        let what = inject(&mut world, &state, &settings.faults, &mut rng).await?;
        let to = Instant::now();
        faults.push((what, from, to));
        let gap = Duration::from_millis(rng.random_range(500..2500));
        tokio::time::sleep(gap).await;
    }
    world.heal_all().await?;
    let healed = Instant::now();
    stop.cancel();
    let writes = writing.await??;

    // Every final state must be reconciled.
    let expected = state.lock().await.expectations(&world).await?;
    let settle_deadline = healed + Duration::from_secs(120);
    let (lost, unseen) = loop {
        let (lost, unseen) = expected.missing(&world.journal);
        if lost.is_empty() || Instant::now() >= settle_deadline {
            break (lost, unseen);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let settle = healed.elapsed();
    // For each loss, the faults in force around the write that was not followed by a
    // reconcile, to point at the path that lost it.
    type Tagged = Vec<(bool, String)>;
    let (lost_in_crash_window, lost): (Tagged, Tagged) = lost
        .into_iter()
        .map(|k| {
            let key = k.split(' ').next().unwrap_or_default();
            let at = expected
                .deleted
                .get(key)
                .or_else(|| expected.owned.get(key))
                .copied();
            let near: Vec<&str> = at
                .map(|at| {
                    faults
                        .iter()
                        .filter(|(_, from, to)| {
                            *from <= at + Duration::from_secs(5)
                                && *to + Duration::from_secs(10) >= at
                        })
                        .map(|(what, _, _)| what.as_str())
                        .collect()
                })
                .unwrap_or_default();
            let crash = expected.deleted.get(key).is_some_and(|at| {
                faults.iter().any(|(what, from, to)| {
                    killed_owner(what, key)
                        && *from <= *at + Duration::from_secs(1)
                        && *at <= *to + Duration::from_secs(4)
                })
            });
            let history = world.journal.history(key, began, 8);
            (
                crash,
                format!("{k}; faults around it: {near:?}; last events: {history}"),
            )
        })
        .partition(|(crash, _)| *crash);
    let strip = |v: Vec<(bool, String)>| v.into_iter().map(|(_, k)| k).collect::<Vec<_>>();
    let (lost_in_crash_window, lost) = (strip(lost_in_crash_window), strip(lost));
    // Each overlap with the replicas, times and faults around it, to point at the path.
    let overlapping: Vec<String> = world
        .journal
        .overlaps()
        .into_iter()
        .map(|(a, b)| {
            let span = |r: &crate::journal::Reconcile| {
                format!(
                    "{} rv {} from {:?} to {:?}",
                    r.replica,
                    r.resource_version,
                    r.start.saturating_duration_since(began),
                    r.end.map(|e| e.saturating_duration_since(began))
                )
            };
            let near: Vec<&str> = faults
                .iter()
                .filter(|(_, from, to)| {
                    *from <= b.start + Duration::from_secs(1)
                        && *to + Duration::from_secs(15) >= a.start
                })
                .map(|(what, _, _)| what.as_str())
                .collect();
            format!(
                "{}: {} and {}; faults around: {near:?}",
                a.key,
                span(&a),
                span(&b)
            )
        })
        .collect();
    let concurrent = overlapping.len();
    let delays = world.journal.delays();
    let faults = faults
        .into_iter()
        .map(|(what, from, to)| {
            let recovery = delays
                .iter()
                .filter(|(w, _)| w.at >= from && w.at <= to + Duration::from_secs(1))
                .map(|(_, d)| *d)
                .max()
                .unwrap_or_default();
            Injected {
                what,
                from,
                to,
                recovery,
            }
        })
        .collect();
    let unseen = unseen
        .into_iter()
        .map(|k| {
            let history = world.journal.history(&k, began, 8);
            format!("{k}; last events: {history}")
        })
        .collect();
    let report = Report {
        seed: settings.seed,
        writes,
        reconciles: world.journal.len(),
        lost,
        unseen,
        lost_in_crash_window,
        concurrent,
        overlapping,
        faults,
        settle,
    };
    world.stop_all().await;
    Ok(report)
}

/// Whether fault `what` killed the dispatcher that owns `key` (`Kind/namespace/name`) on a
/// ring of three or four members.
fn killed_owner(what: &str, key: &str) -> bool {
    let Some(victim) = what
        .strip_prefix("kill-dispatcher ")
        .and_then(|rest| rest.split(' ').next())
    else {
        return false;
    };
    let mut parts = key.splitn(3, '/');
    let (Some(kind), Some(namespace), Some(name)) = (parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    let group = if kind == "Widget" {
        "test.kube-dispatch.dev"
    } else {
        ""
    };
    let request = kube_dispatch_proto::RequestKey::new(group, kind, namespace, name);
    [3usize, 4].iter().any(|n| {
        kube_dispatch_proto::Ring::new((0..*n).map(|i| format!("dispatcher-{i}"))).owner(&request)
            == Some(victim)
    })
}

/// Injects one fault chosen by `rng` among `kinds` (all when empty), holds it, heals it;
/// returns its description. The kinds: 0 and 1 kill -9 and restart gracefully a dispatcher,
/// 2 and 3 a replica; 4 kill -9 of the load-balancer leader; 5 dispatcher scale up or down;
/// 6 an API-server restart, 7 one past the watchers' resourceVersion (410); 8 to 10 a cut, a
/// stall and latency between controllers and a dispatcher, 11 to 13 between a dispatcher and
/// the API server (14 a cut again); 15 and 16 deletion of a live or a stalled dispatcher's
/// Lease; 17 owners changing in a watch gap; 18 every replica away past the idle grace.
async fn inject(
    world: &mut World,
    state: &Mutex<WriterState>,
    kinds: &[u32],
    rng: &mut StdRng,
) -> Result<String, Failure> {
    let hold = Duration::from_millis(rng.random_range(1000..3500));
    let i = rng.random_range(0..DISPATCHERS);
    let j = rng.random_range(0..REPLICAS);
    let replica = format!("replica-{j}");
    let kind = if kinds.is_empty() {
        rng.random_range(0..FAULT_KINDS)
    } else {
        kinds[rng.random_range(0..kinds.len())]
    };
    let what = match kind {
        0 => {
            if let Some(d) = world.dispatchers.get_mut(&i).and_then(|s| s.running.take()) {
                d.kill();
            }
            tokio::time::sleep(hold).await;
            world.start_dispatcher(i).await?;
            format!("kill-dispatcher dispatcher-{i} (kill -9, restart)")
        }
        1 => {
            if let Some(d) = world.dispatchers.get_mut(&i).and_then(|s| s.running.take()) {
                d.stop().await;
            }
            world.start_dispatcher(i).await?;
            format!("restart-dispatcher dispatcher-{i} (graceful)")
        }
        2 => {
            if let Some(r) = world.replicas.get_mut(&replica).and_then(Option::take) {
                r.kill();
                world.journal.killed(&replica);
            }
            tokio::time::sleep(hold).await;
            world.start_replica(&replica)?;
            format!("kill-replica {replica} (kill -9, restart)")
        }
        3 => {
            if let Some(r) = world.replicas.get_mut(&replica).and_then(Option::take) {
                r.stop().await;
            }
            world.start_replica(&replica)?;
            format!("restart-replica {replica} (graceful)")
        }
        4 => {
            let leader = world
                .balancers
                .iter()
                .position(|b| b.as_ref().is_some_and(TestLoadBalancer::leads));
            let Some(leader) = leader else {
                return Ok("kill-lb-leader (no leader at the time: skipped)".into());
            };
            if let Some(lb) = world.balancers[leader].take() {
                lb.kill();
            }
            // The Service forwards to the live one.
            if let Some(other) = world.balancers.iter().flatten().next() {
                world.service.retarget(other.addr);
            }
            tokio::time::sleep(hold).await;
            world.start_balancer(leader).await?;
            "kill-lb-leader (kill -9, restart as standby)".into()
        }
        5 => {
            if let Some(d) = world.dispatchers.get_mut(&3).and_then(|s| s.running.take()) {
                d.stop().await;
                "scale-dispatchers 4 to 3".into()
            } else {
                world.start_dispatcher(3).await?;
                "scale-dispatchers 3 to 4".into()
            }
        }
        6 => {
            Cluster::shared().restart_apiserver().await?;
            "restart-apiserver".into()
        }
        7 => {
            Cluster::shared()
                .restart_apiserver_expiring_watches(&world.namespaces[0])
                .await?;
            "gone-410 (API server restart past the watchers' resourceVersion)".into()
        }
        15 | 16 => {
            // Someone deletes a dispatcher's Lease (kubectl delete lease, a cleanup job): of a
            // live one, which writes it again at its next renewal, or of one stalled as on a
            // partitioned node, which comes back after the hold.
            let stalled = kind == 16;
            let Some(d) = world.dispatchers.get(&i).and_then(|s| s.running.as_ref()) else {
                return Ok("delete-lease (no such dispatcher: skipped)".into());
            };
            if stalled {
                // Stalled past the hold; then its pod is replaced (a process that resumes after
                // a pause longer than its Lease is a case of its own, not covered here).
                d.freeze(hold + Duration::from_secs(5));
            }
            let leases: Api<Lease> =
                Api::namespaced(Cluster::shared().client().await?, &world.lease_namespace());
            match leases
                .delete(&format!("dispatcher-{i}"), &DeleteParams::default())
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(e.into()),
            }
            tokio::time::sleep(hold).await;
            if stalled {
                if let Some(d) = world.dispatchers.get_mut(&i).and_then(|s| s.running.take()) {
                    d.kill();
                }
                world.start_dispatcher(i).await?;
                format!(
                    "delete-lease dispatcher-{i} (stalled, as on a partitioned node, then replaced)"
                )
            } else {
                format!("delete-lease dispatcher-{i} (live)")
            }
        }
        17 => owners_change_in_a_watch_gap(world, state, rng).await?,
        18 => {
            // Every replica away past the idle grace: the groups are dropped, and the
            // controller comes back to what exists (CONTRACT.md, keys.md "A controller that
            // comes back"). Killed replicas' sessions first live out their ttl.
            let kill = rng.random_bool(0.5);
            // No deletions from here until the controllers are back: which of those the
            // contract delivers depends on when each group is made again.
            state.lock().await.pause_deletions = true;
            let stopped = Instant::now();
            for (name, slot) in &mut world.replicas {
                if let Some(r) = slot.take() {
                    if kill {
                        r.kill();
                        world.journal.killed(name);
                    } else {
                        r.stop().await;
                    }
                }
            }
            tokio::time::sleep(TTL + IDLE_GRACE + Duration::from_secs(1)).await;
            let back = Instant::now();
            let names: Vec<String> = world.replicas.keys().cloned().collect();
            for name in names {
                world.start_replica(&name)?;
            }
            let forgiven = back_from_what_exists(world, state, stopped, back).await;
            format!(
                "controllers-away {} replicas past the idle grace ({}), {forgiven} deletions \
                 undelivered when they went not expected",
                world.replicas.len(),
                if kill { "kill -9" } else { "graceful" }
            )
        }
        _ => {
            let (path, fault, name) = match kind {
                8 => ("front", Fault::Cut, "cut"),
                9 => ("front", Fault::Stall, "stall"),
                10 => (
                    "front",
                    Fault::Latency(Duration::from_millis(300)),
                    "latency",
                ),
                11 => ("api", Fault::Cut, "cut"),
                12 => ("api", Fault::Stall, "stall"),
                13 => ("api", Fault::Latency(Duration::from_millis(300)), "latency"),
                _ => ("front", Fault::Cut, "cut"),
            };
            let Some(slot) = world.dispatchers.get(&i) else {
                return Ok("network (no such dispatcher: skipped)".into());
            };
            let proxy = if path == "front" {
                &slot.front
            } else {
                &slot.api
            };
            proxy.set(fault);
            tokio::time::sleep(hold).await;
            proxy.set(Fault::None);
            if path == "front" {
                format!("net-{name} controllers<->dispatcher-{i}")
            } else {
                format!("net-{name} dispatcher-{i}<->apiserver")
            }
        }
    };
    Ok(what)
}

/// Fault 17: in one namespace, a child moves from one Widget to another and another Widget's
/// child is deleted while no dispatcher can reach the API server, whose watches then expire
/// (410) so that the changes are found only by the re-list. All three owners must be told.
async fn owners_change_in_a_watch_gap(
    world: &mut World,
    state: &Mutex<WriterState>,
    rng: &mut StdRng,
) -> Result<String, Failure> {
    let objects = world.objects;
    let ns = world.namespaces[rng.random_range(0..world.namespaces.len())]
        .name()
        .to_owned();
    let mut picked = BTreeSet::new();
    while picked.len() < 3 {
        picked.insert(rng.random_range(0..objects));
    }
    let names: Vec<String> = picked.iter().map(|i| format!("obj-{i}")).collect();
    let (from, to, bereaved) = (&names[0], &names[1], &names[2]);
    let client = Cluster::shared().client().await?;
    let widgets: Api<Widget> = Api::namespaced(client.clone(), &ns);
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let mut uids = BTreeMap::new();
    for name in &names {
        match widgets.get_opt(name).await? {
            Some(w) => uids.insert(name.clone(), w.uid().unwrap_or_default()),
            None => {
                return Ok(format!(
                    "owners-change in a watch gap ({name} absent: skipped)"
                ));
            }
        };
    }
    let (label_key, label_value) = world.label.split_once('=').unwrap_or_default();
    let child = |name: &str, owner: &str| {
        serde_json::json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": name,
                "labels": { label_key: label_value },
                "ownerReferences": [{
                    "apiVersion": "test.kube-dispatch.dev/v1",
                    "kind": "Widget",
                    "name": owner,
                    "uid": uids[owner],
                    "controller": true,
                }],
            },
        })
    };
    // Children of their own, which the writer never touches.
    let moving = format!("{from}-moving");
    let doomed = format!("{bereaved}-doomed");
    let params = PatchParams::apply("kube-dispatch-chaos-owners").force();
    // Children indexed by each running dispatcher.
    let indexed = |world: &World| -> Vec<u64> {
        world
            .dispatchers
            .values()
            .filter_map(|slot| slot.running.as_ref())
            .map(|d| d.watch_total(|c| &c.children))
            .collect()
    };
    let children_before = indexed(world);
    let made = Instant::now();
    cms.patch(&moving, &params, &Patch::Apply(child(&moving, from)))
        .await?;
    cms.patch(&doomed, &params, &Patch::Apply(child(&doomed, bereaved)))
        .await?;
    // Once every running dispatcher has indexed the two children (its children gauge grew by
    // two) and both owners were reconciled since, the dispatchers know who owns them.
    let told: BTreeMap<String, Instant> = [from, bereaved]
        .iter()
        .map(|n| (format!("Widget/{ns}/{n}"), made))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let now = indexed(world);
        let all_indexed = now.len() == children_before.len()
            && now.iter().zip(&children_before).all(|(n, b)| *n >= b + 2);
        if all_indexed && world.journal.unreconciled_since(&told, false).is_empty() {
            break;
        }
        if Instant::now() >= deadline {
            return Ok(format!(
                "owners-change in a watch gap ({ns}: children not indexed by every dispatcher within 15 s: skipped)"
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for slot in world.dispatchers.values() {
        slot.api.set(Fault::Cut);
    }
    let before = Instant::now();
    let changed: Result<(), Failure> = async {
        cms.patch(&moving, &params, &Patch::Apply(child(&moving, to)))
            .await?;
        cms.delete(&doomed, &DeleteParams::default()).await?;
        Ok(())
    }
    .await;
    // Resuming from before the gap must answer 410, so that only a re-list finds the changes.
    let restarted = Cluster::shared()
        .restart_apiserver_expiring_watches(&world.namespaces[0])
        .await;
    for slot in world.dispatchers.values() {
        slot.api.set(Fault::None);
    }
    changed?;
    restarted?;
    let mut s = state.lock().await;
    for name in [from, to, bereaved] {
        s.owned_changed(format!("Widget/{ns}/{name}"), before);
    }
    Ok(format!(
        "owners-change in a watch gap ({ns}: {moving} from {from} to {to}, {doomed} deleted; 410)"
    ))
}

/// How long before the controllers went away a deletion may still have been waiting in a
/// group that fault 18 then drops: the longest a fault before it delays delivery.
const AWAY_REACH: Duration = Duration::from_secs(20);

/// After fault 18: waits until every object that exists was handed to the controllers again
/// since they came `back` (so every dispatcher has its group again), lets the writer delete
/// again, and forgets the writer's deletions made from `AWAY_REACH` before they `stopped` that
/// no reconcile saw: the dropped groups held them, and the contract does not deliver them.
/// Returns how many.
async fn back_from_what_exists(
    world: &World,
    state: &Mutex<WriterState>,
    stopped: Instant,
    back: Instant,
) -> usize {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let live: BTreeMap<String, Instant> = state
            .lock()
            .await
            .live
            .iter()
            .map(|k| (k.clone(), back))
            .collect();
        // Not within the deadline: the final check reports the objects never handed back.
        if world.journal.unreconciled_since(&live, false).is_empty() || Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut s = state.lock().await;
    s.pause_deletions = false;
    let unseen: BTreeSet<String> = world
        .journal
        .unreconciled_since(&s.deleted, true)
        .into_iter()
        .collect();
    let before = s.deleted.len();
    let from = stopped.checked_sub(AWAY_REACH).unwrap_or(stopped);
    s.deleted
        .retain(|k, at| !(unseen.contains(k) && *at >= from && *at <= stopped));
    before - s.deleted.len()
}

/// The writer's knowledge of what it wrote, for the final check.
#[derive(Default)]
struct WriterState {
    /// Keys the writer last deleted, with the time just before the delete.
    deleted: BTreeMap<String, Instant>,
    /// Widgets whose owned ConfigMap the writer changed last, with the time before the write.
    owned: BTreeMap<String, Instant>,
    /// Keys that exist as far as the writer knows.
    live: BTreeSet<String>,
    /// Deletions are held back (fault 18, while the controllers are away and coming back).
    pause_deletions: bool,
}

/// What the journal must show at the end.
struct Expected {
    finals: BTreeMap<String, u64>,
    deleted: BTreeMap<String, Instant>,
    owned: BTreeMap<String, Instant>,
}

impl Expected {
    /// The final states not reconciled yet, and apart the deletions created and deleted
    /// again unseen ([`Report::unseen`]).
    fn missing(&self, journal: &Journal) -> (Vec<String>, Vec<String>) {
        let mut missing = journal.unreconciled(&self.finals);
        let (unseen, deletions): (Vec<String>, Vec<String>) = journal
            .unreconciled_since(&self.deleted, true)
            .into_iter()
            .partition(|k| journal.last_view_is_deleted(k));
        missing.extend(deletions.into_iter().map(|k| format!("{k} (deleted)")));
        missing.extend(
            journal
                .unreconciled_since(&self.owned, false)
                .into_iter()
                .map(|k| format!("{k} (owned object changed)")),
        );
        (missing, unseen)
    }
}

impl WriterState {
    /// Expects a reconcile of `key` started after `at`, unless a later write already does.
    fn owned_changed(&mut self, key: String, at: Instant) {
        let later = self.owned.get(&key).is_some_and(|t| *t > at);
        if !later {
            self.owned.insert(key, at);
        }
    }

    /// The final states, read from the API server.
    async fn expectations(&self, world: &World) -> Result<Expected, Failure> {
        let client = Cluster::shared().client().await?;
        let mut finals = BTreeMap::new();
        let params = ListParams::default().labels(&world.label);
        for ns in &world.namespaces {
            let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns.name());
            for cm in cms.list(&params).await? {
                // Owned children are the garbage collector's to delete: only what the writer
                // wrote directly is checked.
                if cm.owner_references().is_empty() {
                    finals.insert(key("ConfigMap", &cm), rv(&cm));
                }
            }
            let widgets: Api<Widget> = Api::namespaced(client.clone(), ns.name());
            for w in widgets.list(&params).await? {
                finals.insert(key("Widget", &w), rv(&w));
            }
        }
        // A deletion counts only if the object is still gone.
        let deleted = self
            .deleted
            .iter()
            .filter(|(k, _)| !finals.contains_key(*k))
            .map(|(k, t)| (k.clone(), *t))
            .collect();
        let owned = self
            .owned
            .iter()
            .filter(|(k, _)| finals.contains_key(*k))
            .map(|(k, t)| (k.clone(), *t))
            .collect();
        Ok(Expected {
            finals,
            deleted,
            owned,
        })
    }
}

fn key<K: Resource<DynamicType = ()>>(kind: &str, obj: &K) -> String {
    format!(
        "{kind}/{}/{}",
        obj.meta().namespace.clone().unwrap_or_default(),
        obj.meta().name.clone().unwrap_or_default()
    )
}

fn rv<K: Resource>(obj: &K) -> u64 {
    obj.meta()
        .resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

struct Writer {
    client_namespaces: Vec<String>,
    label: String,
    journal: Journal,
    rng: StdRng,
    objects: usize,
    state: Arc<Mutex<WriterState>>,
}

impl Writer {
    fn new(world: &World, seed: u64, objects: usize) -> Self {
        Self {
            client_namespaces: world
                .namespaces
                .iter()
                .map(|n| n.name().to_owned())
                .collect(),
            label: world.label.clone(),
            journal: world.journal.clone(),
            rng: StdRng::seed_from_u64(seed ^ 0x5eed),
            objects,
            state: Arc::new(Mutex::new(WriterState::default())),
        }
    }

    /// Writes until `stop`; returns the number of writes that succeeded. Writes that fail (the
    /// API server restarting) are skipped: the final check reads the final states back.
    async fn run(
        mut self,
        period: Duration,
        stop: CancellationToken,
    ) -> Result<usize, FixtureError> {
        let client = Cluster::shared().client().await?;
        let (label_key, label_value) = self.label.split_once('=').unwrap_or_default();
        let (label_key, label_value) = (label_key.to_owned(), label_value.to_owned());
        let params = PatchParams::apply("kube-dispatch-chaos").force();
        let mut writes = 0usize;
        let mut tick = tokio::time::interval(period);
        // Create everything first.
        let mut plan: Vec<(usize, usize, bool)> = Vec::new();
        for ns in 0..self.client_namespaces.len() {
            for i in 0..self.objects {
                plan.push((ns, i, false));
                plan.push((ns, i, true));
            }
        }
        let mut round = 0u64;
        loop {
            let (ns, i, widget, op) = if let Some((ns, i, widget)) = plan.pop() {
                (ns, i, widget, 0u32)
            } else {
                (
                    self.rng.random_range(0..self.client_namespaces.len()),
                    self.rng.random_range(0..self.objects),
                    self.rng.random_range(0..5u32) < 2,
                    self.rng.random_range(0..10u32),
                )
            };
            tokio::select! {
                () = stop.cancelled() => return Ok(writes),
                _ = tick.tick() => {}
            }
            round += 1;
            let namespace = self.client_namespaces[ns].clone();
            let name = format!("obj-{i}");
            let kind = if widget { "Widget" } else { "ConfigMap" };
            let k = format!("{kind}/{namespace}/{name}");
            let (exists, may_delete) = {
                let s = self.state.lock().await;
                (s.live.contains(&k), !s.pause_deletions)
            };
            let before = Instant::now();
            let labels = serde_json::json!({ label_key.clone(): label_value.clone() });
            let outcome: Result<(), kube::Error> = async {
                // ConfigMaps are deleted too. Widgets are not: a deletion found by a re-list
                // reaches the reconciler as a tombstone only for types that can be built from
                // metadata alone, and a Widget's spec is required.
                if exists && may_delete && op < 2 && !widget {
                    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
                    api.delete(&name, &DeleteParams::default()).await?;
                    let mut s = self.state.lock().await;
                    s.live.remove(&k);
                    s.deleted.insert(k.clone(), before);
                    self.journal.deleted(k.clone());
                    s.owned.remove(&k);
                    return Ok(());
                }
                if widget {
                    let api: Api<Widget> = Api::namespaced(client.clone(), &namespace);
                    if exists && op < 4 {
                        // Change the owned ConfigMap only: the owner must be reconciled.
                        let owner = api.get(&name).await?;
                        let child = serde_json::json!({
                            "apiVersion": "v1",
                            "kind": "ConfigMap",
                            "metadata": {
                                "name": format!("{name}-child"),
                                "labels": labels,
                                "ownerReferences": [{
                                    "apiVersion": "test.kube-dispatch.dev/v1",
                                    "kind": "Widget",
                                    "name": name,
                                    "uid": owner.uid(),
                                    "controller": true,
                                }],
                            },
                            "data": { "round": round.to_string() },
                        });
                        let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
                        cms.patch(&format!("{name}-child"), &params, &Patch::Apply(&child))
                            .await?;
                        self.state.lock().await.owned_changed(k.clone(), before);
                        return Ok(());
                    }
                    let w = serde_json::json!({
                        "apiVersion": "test.kube-dispatch.dev/v1",
                        "kind": "Widget",
                        "metadata": { "name": name, "labels": labels },
                        "spec": { "size": round },
                    });
                    let written = api.patch(&name, &params, &Patch::Apply(&w)).await?;
                    self.journal.wrote(k.clone(), rv(&written));
                } else {
                    let cm = serde_json::json!({
                        "apiVersion": "v1",
                        "kind": "ConfigMap",
                        "metadata": { "name": name, "labels": labels },
                        "data": { "round": round.to_string() },
                    });
                    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
                    let written = api.patch(&name, &params, &Patch::Apply(&cm)).await?;
                    self.journal.wrote(k.clone(), rv(&written));
                }
                let mut s = self.state.lock().await;
                s.live.insert(k.clone());
                s.deleted.remove(&k);
                Ok(())
            }
            .await;
            match outcome {
                Ok(()) => writes += 1,
                Err(kube::Error::Api(s)) if s.code == 404 => {
                    // Deleted meanwhile (a child's owner, or a retried delete).
                    self.state.lock().await.live.remove(&k);
                }
                Err(_) => {
                    // The API server may be restarting. The final states are read back at the
                    // end; a write whose answer was lost may still have happened, so forget
                    // what this one meant for the checks that rely on the writer's memory.
                    let mut s = self.state.lock().await;
                    s.deleted.remove(&k);
                    s.owned.remove(&k);
                }
            }
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("unreachable")]
struct Never;

struct Checker {
    journal: Journal,
    replica: String,
}

async fn record<K: Resource<DynamicType = ()>>(
    kind: &str,
    obj: &K,
    checker: &Checker,
) -> Result<Action, Never> {
    let _running = checker.journal.start_reconcile(
        key(kind, obj),
        rv(obj),
        obj.meta().deletion_timestamp.is_some(),
        &checker.replica,
    );
    // A little work, so reconciles overlap in time when exclusivity breaks.
    tokio::time::sleep(Duration::from_millis(20)).await;
    Ok(Action::await_change())
}

/// A controller replica running two groups on the SDK: ConfigMaps, and Widgets owning
/// ConfigMaps, both selected by `label`, recording every reconcile in `journal`.
fn start_checker(
    replica: &str,
    label: &str,
    load_balancer: std::net::SocketAddr,
    journal: &Journal,
) -> Result<Isolated, FixtureError> {
    let (replica, label, journal) = (replica.to_owned(), label.to_owned(), journal.clone());
    let name = replica.clone();
    Isolated::spawn(&name, move |shutdown| async move {
        let client = match Cluster::shared().client().await {
            Ok(c) => c,
            Err(e) => panic!("chaos replica has no client: {e}"),
        };
        let checker = Arc::new(Checker {
            journal,
            replica: replica.clone(),
        });
        let lb = load_balancer.to_string();
        let configmaps = Controller::<ConfigMap>::new(client.clone(), "chaos-configmaps")
            .labels(label.clone())
            .load_balancer(lb.clone())
            .credentials(crate::credentials())
            .replica_id(replica.clone())
            .concurrency(8)
            .session_ttl(TTL)
            .graceful_shutdown_on(shutdown.clone().cancelled_owned())
            .run(
                |cm, c: Arc<Checker>| async move { record("ConfigMap", &*cm, &c).await },
                |_, _: &Never, _| Action::await_change(),
                checker.clone(),
            )
            .for_each(|_| async {});
        let widgets = Controller::<Widget>::new(client, "chaos-widgets")
            .labels(label)
            .owns::<ConfigMap>()
            .load_balancer(lb)
            .credentials(crate::credentials())
            .replica_id(replica)
            .concurrency(8)
            .session_ttl(TTL)
            .graceful_shutdown_on(shutdown.cancelled_owned())
            .run(
                |w, c: Arc<Checker>| async move { record("Widget", &*w, &c).await },
                |_, _: &Never, _| Action::await_change(),
                checker,
            )
            .for_each(|_| async {});
        futures::join!(configmaps, widgets);
    })
}
