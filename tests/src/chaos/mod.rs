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

use std::{collections::BTreeMap, fmt, time::Duration};

use rand::{RngExt, SeedableRng, rngs::StdRng};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::{Cluster, TestNamespace, ensure_widget_crd, faultproxy::FaultProxy, journal::Journal};

mod checker;
mod faults;
mod load;
mod world;
mod writer;

use faults::{inject, killed_owner};
use world::World;
use writer::{Expected, Writer};

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
/// `--join-warm-up` of the chaos dispatchers: a dispatcher started without a Lease of its own
/// (after a drain, or the first time) warms up, its groups made by the replicas the load
/// balancer places there, while faults run; bounded well inside a run.
const WARM_UP: Duration = Duration::from_secs(10);

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
pub const FAULT_KINDS: u32 = 22;

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
    /// The key of that write, to tell which dispatcher owned what waited.
    pub slowest: Option<String>,
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
                "    {:<46} held {:>5.1?}  recovery {:>5.1?}  {}",
                fault.what,
                fault.to.saturating_duration_since(fault.from),
                fault.recovery,
                fault.slowest.as_deref().unwrap_or_default()
            )?;
        }
        writeln!(f, "  by kind (count, worst recovery):")?;
        for (kind, (n, worst)) in by_kind {
            writeln!(f, "    {kind:<20} {n:>3}  {worst:>5.1?}")?;
        }
        Ok(())
    }
}

/// Runs the tier under seeded faults for `settings.duration` and returns the checker's report.
pub async fn run(settings: Settings) -> Result<Report, Failure> {
    let mut world = World::start(&settings).await?;

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
    let (lost_in_crash_window, lost) =
        explain_losses(lost, &expected, &faults, &world.journal, began);
    let overlapping = explain_overlaps(&world.journal, &faults, began);
    let concurrent = overlapping.len();
    let delays = world.journal.delays();
    let faults = faults
        .into_iter()
        .map(|(what, from, to)| {
            let slowest = delays
                .iter()
                .filter(|(w, _)| w.at >= from && w.at <= to + Duration::from_secs(1))
                .max_by_key(|(_, d)| *d);
            Injected {
                what,
                from,
                to,
                recovery: slowest.map(|(_, d)| *d).unwrap_or_default(),
                slowest: slowest.map(|(w, _)| w.key.clone()),
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

impl World {
    /// The world of `settings`: its namespaces, and every dispatcher, both load balancers and
    /// every replica started.
    async fn start(settings: &Settings) -> Result<World, Failure> {
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
        Ok(world)
    }
}

/// A fault as injected: what, from when, to when.
type Injection = (String, Instant, Instant);

/// Each loss with the faults in force around the write that was not followed by a reconcile,
/// to point at the path that lost it: those a killed owner may explain (its crash window), and
/// the others.
fn explain_losses(
    lost: Vec<String>,
    expected: &Expected,
    faults: &[Injection],
    journal: &Journal,
    began: Instant,
) -> (Vec<String>, Vec<String>) {
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
            let history = journal.history(key, began, 8);
            (
                crash,
                format!("{k}; faults around it: {near:?}; last events: {history}"),
            )
        })
        .partition(|(crash, _)| *crash);
    let strip = |v: Vec<(bool, String)>| v.into_iter().map(|(_, k)| k).collect::<Vec<_>>();
    (strip(lost_in_crash_window), strip(lost))
}

/// Each overlap of two replicas' reconciles of a key, with their times and the faults around
/// them, to point at the path.
fn explain_overlaps(journal: &Journal, faults: &[Injection], began: Instant) -> Vec<String> {
    journal
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
        .collect()
}
