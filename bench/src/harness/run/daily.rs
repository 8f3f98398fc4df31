//! `daily`: the events a controller meets every day, each controller in the shape it runs in
//! production (`make bench-daily`).
//!
//! The shapes: a kube-rs controller as two replicas, the standby cold until it takes the Lease
//! (`kube-lease-manager`); a controller-runtime controller as two replicas under its leader
//! election, the standby cold, and again with `EnableWarmup` (the standby fills its cache before
//! it leads); and the tier: its dispatchers, the load balancer with a standby, and two SDK
//! replicas. Each starts cold on the scenario's objects and is waited for until it has
//! reconciled every one; then, while a writer changes the objects at a steady pace, each event
//! runs in turn:
//!
//! - **steady**: nothing happens for a while, the reference for the others;
//! - **rollout**: every controller replica is replaced, one at a time, as a Deployment's rolling
//!   update does (the new one started and ready, then the old one sent SIGTERM);
//! - **tier upgrade** (the tier only): every dispatcher is stopped (SIGTERM) and started again,
//!   highest ordinal first, each ready before the next, as a StatefulSet's rolling update does.
//!
//! An event's window runs from its start until the controller has reconciled a write made after
//! its last step, every write has been reconciled and the API server is quiet again: what the API
//! server spent in it, beside what it would have spent in a steady window as long, the requests
//! on the objects' resource, and the writes' write-to-reconcile times.

use std::{
    path::{Path, PathBuf},
    sync::Mutex,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use k8s_openapi::api::coordination::v1::Lease;
use kube::{
    Api,
    api::{DeleteParams, ListParams},
};
use kube_dispatch_bench::{ReconcileStart, now_micros};
use serde::Serialize;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::{
    Setup, Tier, Variant,
    measure::{Observations, Write, latencies},
    processes::group_channel,
};
use crate::harness::{
    apiserver::{metrics_text, request_counts, sum_where},
    process::Component,
    report::percentile,
};

/// Controller replicas of every shape.
const REPLICAS: usize = 2;

/// The Lease the kube-rs replicas lead through (controller-runtime names its own).
const KUBE_RS_LEASE: &str = "bench-controller-leader";

/// How long a stopped process may take to exit before it is killed: a pod's default
/// `terminationGracePeriodSeconds`.
const GRACE: Duration = Duration::from_secs(30);

/// The longest a replica may take to say it is ready, a restarted dispatcher to serve again,
/// or a controller to reconcile again after an event.
const BOUND: Duration = Duration::from_secs(120);

/// How a controller runs in production.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Shape {
    /// kube-rs: two replicas, the one holding the Lease (`kube-lease-manager`) running its
    /// `Controller`; the standby holds no watch and no cache.
    KubeRsStandby,
    /// controller-runtime: two replicas under its leader election; the standby starts its
    /// controller, sources and cache only once it leads.
    ControllerRuntimeLeader,
    /// The same with `EnableWarmup`: the standby lists and watches, filling its cache, before
    /// it leads.
    ControllerRuntimeWarm,
    /// kube-dispatch: the dispatchers, the load balancer and a standby one, and two SDK
    /// replicas sharing the keys.
    Tier,
}

impl Shape {
    /// The variant whose replicas the shape runs.
    fn variant(self) -> Variant {
        match self {
            Shape::KubeRsStandby => Variant::KubeRs,
            Shape::ControllerRuntimeLeader | Shape::ControllerRuntimeWarm => {
                Variant::ControllerRuntime
            }
            Shape::Tier => Variant::Dispatch(REPLICAS),
        }
    }

    /// The replicas' arguments beyond the variant's.
    fn args(self) -> &'static [&'static str] {
        match self {
            Shape::KubeRsStandby => &["--leader-elect", KUBE_RS_LEASE],
            Shape::ControllerRuntimeLeader => &["--leader-elect"],
            Shape::ControllerRuntimeWarm => &["--leader-elect", "--warmup"],
            Shape::Tier => &[],
        }
    }

    /// The events it meets, in order: the steady window first, which the others are set
    /// against.
    fn events(self) -> &'static [Event] {
        match self {
            Shape::Tier => &[Event::Steady, Event::Rollout, Event::TierUpgrade],
            _ => &[Event::Steady, Event::Rollout],
        }
    }

    /// Whether it needs the controller-runtime binary.
    pub(crate) fn is_controller_runtime(self) -> bool {
        self.variant() == Variant::ControllerRuntime
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Shape::KubeRsStandby => "kube-rs, cold standby",
            Shape::ControllerRuntimeLeader => "controller-runtime, cold standby",
            Shape::ControllerRuntimeWarm => "controller-runtime, warm standby",
            Shape::Tier => "kube-dispatch",
        }
    }
}

impl std::fmt::Display for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What happens to the controller.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Event {
    /// Nothing: the writes alone, for `steady`.
    Steady,
    /// Every controller replica replaced, one at a time.
    Rollout,
    /// Every dispatcher restarted, one at a time.
    TierUpgrade,
}

impl Event {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Event::Steady => "steady",
            Event::Rollout => "controller rollout",
            Event::TierUpgrade => "tier upgrade",
        }
    }
}

/// What one event cost, in one run.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Measured {
    pub(crate) shape: Shape,
    pub(crate) event: Event,
    pub(crate) run: usize,
    /// From the event's start until the controller had reconciled a write made after its last
    /// step, and every write before.
    pub(crate) recovered_s: f64,
    /// From the event's start until every write was reconciled and the API server quiet.
    pub(crate) window_s: f64,
    /// The API server's CPU in the window.
    pub(crate) apiserver_cpu_s: f64,
    /// `apiserver_cpu_s` less what the steady window's rates would have spent in as long (its
    /// rate while writing over `recovered_s`, its rate after over the rest): what the event
    /// itself cost (none for the steady window).
    pub(crate) above_steady_s: Option<f64>,
    /// The API server's CPU from the event's start to `recovered_s`, while the writer wrote.
    pub(crate) cpu_recovered_s: f64,
    /// Requests on the objects' resource in the window, the writer's PATCHes left out: LIST
    /// requests (each page of a paged list), streaming lists (a WATCH with
    /// `sendInitialEvents`), GETs and PATCHes.
    pub(crate) lists: u64,
    pub(crate) watch_lists: u64,
    pub(crate) gets: u64,
    pub(crate) patches: u64,
    /// Writes made in the window, and their write-to-reconcile times.
    pub(crate) writes: usize,
    pub(crate) p50_ms: f64,
    pub(crate) p99_ms: f64,
    pub(crate) max_ms: f64,
    /// Resident memory of every process of the shape (replicas; dispatchers and load
    /// balancers) at the window's end.
    pub(crate) rss_mib: f64,
    /// On the steady window only: from starting the shape's processes until every object had
    /// been reconciled.
    pub(crate) cold_start_s: Option<f64>,
    /// Judgements that a member died, since the last event (the steady window's count from
    /// the shape's start): each dispatcher's `dispatcher judged dead` log lines (warnings, which
    /// `RUST_LOG` must keep), one per dispatcher that saw the death. The keys that move from
    /// a member judged dead wait, up to the handover bound; a clean rolling upgrade of the tier
    /// makes none.
    pub(crate) judged_dead: u64,
}

/// The API server's CPU per second in the steady window: while the writer wrote, and after it
/// stopped until the API server was quiet.
#[derive(Clone, Copy, Debug)]
struct Rates {
    writing: f64,
    after: f64,
}

impl Rates {
    fn of(steady: &Measured) -> Self {
        let after_s = steady.window_s - steady.recovered_s;
        Self {
            writing: steady.cpu_recovered_s / steady.recovered_s.max(f64::EPSILON),
            after: if after_s > 0.0 {
                (steady.apiserver_cpu_s - steady.cpu_recovered_s) / after_s
            } else {
                0.0
            },
        }
    }

    /// What a window `window_s` long whose writer wrote for `writing_s` would have cost at
    /// these rates.
    fn expected(self, writing_s: f64, window_s: f64) -> f64 {
        self.writing * writing_s + self.after * (window_s - writing_s).max(0.0)
    }
}

/// The API server's count of streaming lists, by resource.
const WATCH_LISTS: &str = "apiserver_watch_list_duration_seconds_count";

/// The timed writes: each object's key, when (micros), and what was written.
type Sent = Mutex<Vec<(String, u64, Write)>>;

/// A shape's processes while its events run.
struct Running {
    replicas: Vec<Component>,
    /// Replicas started so far: the next one's number.
    started: usize,
    tier: Option<Tier>,
    standby_lb: Option<Component>,
    observed: watch::Receiver<Observations>,
    group_tx: mpsc::Sender<ReconcileStart>,
    program: PathBuf,
    args: Vec<String>,
    lb_port: u16,
    log_dir: PathBuf,
    /// Dispatchers restarted so far, which names their logs.
    restarts: usize,
    /// Judgements that a member died counted into events so far.
    judged_counted: u64,
}

impl Setup<'_> {
    /// Runs `shape` once: its cold start, then each of its events, measured.
    pub(crate) async fn daily(&self, shape: Shape, run: usize) -> anyhow::Result<Vec<Measured>> {
        let log_dir = self.log_dir.join(format!(
            "daily-{}x{}-{shape:?}-{run}",
            self.kinds_flag(),
            self.objects
        ));
        std::fs::create_dir_all(&log_dir)
            .with_context(|| format!("cannot create {}", log_dir.display()))?;
        // The folder is the same for each invocation: logs of an earlier one (restarts are
        // named by their number) would count again in the members judged dead.
        for entry in std::fs::read_dir(&log_dir)? {
            let path = entry?.path();
            if path.extension().is_some_and(|e| e == "log") {
                std::fs::remove_file(&path)
                    .with_context(|| format!("cannot remove {}", path.display()))?;
            }
        }
        // A leader Lease a killed replica of an earlier run left would hold this run's back
        // for its whole duration.
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), self.namespace);
        leases
            .delete_collection(&DeleteParams::default(), &ListParams::default())
            .await
            .context("cannot clear the Leases of earlier runs")?;
        // The cold start counts from here: the tier's own start (its ring, its load balancer
        // leading) is part of it, as an incumbent's first Lease is of its.
        let begun = now_micros();
        let (tier, standby_lb, lb_port) = if shape == Shape::Tier {
            let tier = self.start_tier(&log_dir, None).await?;
            let standby = self.spawn_loadbalancer("loadbalancer-standby", &log_dir)?;
            let port = tier.lb_port;
            (Some(tier), Some(standby), port)
        } else {
            (None, None, 0)
        };
        let written = self.written_objects();
        let (tx, observed, observer) = self.observe(&written);
        let (program, _, variant_args) = self.replica_command(shape.variant())?;
        let args = [
            vec!["--kind".to_owned(), self.group_kind(0).flag().to_owned()],
            variant_args,
            shape.args().iter().map(|a| (*a).to_owned()).collect(),
        ]
        .concat();
        let mut running = Running {
            replicas: Vec::new(),
            started: 0,
            tier,
            standby_lb,
            observed,
            group_tx: group_channel(0, &tx),
            program: program.to_owned(),
            args,
            lb_port,
            log_dir,
            restarts: 0,
            judged_counted: 0,
        };
        drop(tx);
        let result = self
            .events((shape, run), begun, &written, &mut running)
            .await;
        observer.abort();
        let tier = running.tier.map(|t| t.components).unwrap_or_default();
        let all = running
            .replicas
            .into_iter()
            .chain(tier)
            .chain(running.standby_lb);
        futures::future::join_all(all.map(Component::kill)).await;
        result
    }

    /// The cold start begun at `begun` (micros), awaited, then each event of `shape` measured.
    async fn events(
        &self,
        (shape, run): (Shape, usize),
        begun: u64,
        written: &[usize],
        running: &mut Running,
    ) -> anyhow::Result<Vec<Measured>> {
        // One at a time, each ready first: the first leads, as in a fresh install.
        for _ in 0..REPLICAS {
            let mut replica = running.spawn_replica(self)?;
            replica.ready(BOUND).await?;
            running.replicas.push(replica);
        }
        let tier = running
            .tier
            .as_mut()
            .map_or(&mut [][..], |t| &mut t.components[..]);
        let (_, all) = self
            .cold_start(
                shape.variant(),
                begun,
                &mut running.observed,
                &mut running.replicas,
                tier,
            )
            .await?;
        let cold_start_s = Duration::from_micros(all.saturating_sub(begun)).as_secs_f64();
        self.control_plane.quiet().await;
        let mut measured: Vec<Measured> = Vec::new();
        for event in shape.events() {
            let steady = measured
                .iter()
                .find(|m| m.event == Event::Steady)
                .map(Rates::of);
            let mut m = self
                .event((shape, *event), run, written, running, steady)
                .await
                .with_context(|| format!("{shape}: {}", event.name()))?;
            if *event == Event::Steady {
                m.cold_start_s = Some(cold_start_s);
            }
            measured.push(m);
        }
        Ok(measured)
    }

    /// Runs `event` while the writer writes, and measures it; `steady` are the steady
    /// window's rates.
    async fn event(
        &self,
        (shape, event): (Shape, Event),
        run: usize,
        written: &[usize],
        running: &mut Running,
        steady: Option<Rates>,
    ) -> anyhow::Result<Measured> {
        let metrics_before = metrics_text(self.client).await?;
        let requests_before = request_counts(self.client).await?;
        let cpu_before = self.control_plane.cpu_seconds().0;
        let begun = Instant::now();
        let sent: Sent = Mutex::new(Vec::new());
        let stop = CancellationToken::new();
        // Unique to the shape too: a write of a value already there changes nothing, and its
        // reconcile would be one made before it.
        let label = format!("{}-daily-{run}-{shape:?}-{event:?}", self.nonce);
        let acting = async {
            let acted = async {
                running.act(self, event).await?;
                let acted = now_micros();
                recovered(&mut running.observed, &sent, acted).await
            }
            .await;
            stop.cancel();
            acted
        };
        {
            let mut writes = std::pin::pin!(self.write_steadily(&label, written, &sent, &stop));
            // A writer that fails ends the event at once: what it waits for would never come.
            tokio::select! {
                acted = acting => acted?,
                wrote = &mut writes => {
                    wrote?;
                    anyhow::bail!("the writer stopped before the event ended");
                }
            }
            writes.await?;
        }
        let recovered_s = begun.elapsed().as_secs_f64();
        let cpu_recovered_s = self.control_plane.cpu_seconds().0 - cpu_before;
        let sent = sent.into_inner().unwrap_or_else(|e| e.into_inner());
        let (mut latencies, _) = latencies(&mut running.observed, &sent, BOUND).await?;
        latencies.sort_unstable();
        self.control_plane.quiet().await;
        let window_s = begun.elapsed().as_secs_f64();
        let apiserver_cpu_s = self.control_plane.cpu_seconds().0 - cpu_before;
        let requests = request_counts(self.client).await?;
        let metrics = metrics_text(self.client).await?;
        let rss_mib = running.rss()? as f64 / f64::from(1 << 20);
        let resources = self.resources();
        let count = |verb| -> u64 {
            resources
                .iter()
                .map(|resource| requests.since(&requests_before, resource, verb))
                .sum()
        };
        // Streaming lists (a WATCH with sendInitialEvents, client-go's default since 1.35)
        // are counted when their initial list ends; a WATCH only when it closes.
        let watch_lists: f64 = resources
            .iter()
            .map(|resource| {
                let of_resource = format!("resource=\"{resource}\"");
                sum_where(&metrics, WATCH_LISTS, &[&of_resource])
                    - sum_where(&metrics_before, WATCH_LISTS, &[&of_resource])
            })
            .sum();
        let ms = |p| percentile(&latencies, p).map_or(0.0, |us| us / 1000.0);
        // Every child as its owner says (the controller repaired each child written and
        // followed each owner), checked after the window so the check's lists are not in it.
        self.children_repaired(shape.variant()).await?;
        self.control_plane.quiet().await;
        Ok(Measured {
            shape,
            event,
            run,
            recovered_s,
            window_s,
            apiserver_cpu_s,
            cpu_recovered_s,
            above_steady_s: steady
                .filter(|_| event != Event::Steady)
                .map(|r| apiserver_cpu_s - r.expected(recovered_s, window_s)),
            lists: count("LIST"),
            watch_lists: watch_lists.max(0.0).round() as u64,
            gets: count("GET"),
            patches: count("PATCH").saturating_sub(sent.len() as u64),
            writes: sent.len(),
            p50_ms: ms(0.5),
            p99_ms: ms(0.99),
            max_ms: ms(1.0),
            rss_mib,
            cold_start_s: None,
            judged_dead: running.judged_dead_since_last()?,
        })
    }

    /// Writes the objects of `written` in turn, one every `write_interval`, until `stop`.
    async fn write_steadily(
        &self,
        label: &str,
        written: &[usize],
        sent: &Sent,
        stop: &CancellationToken,
    ) -> anyhow::Result<()> {
        let mut ticks = tokio::time::interval(self.write_interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        for n in 0.. {
            tokio::select! {
                biased;
                () = stop.cancelled() => break,
                _ = ticks.tick() => {}
            }
            let i = written[n % written.len()];
            let write = self.write(n, i, &format!("{label}-{n}")).await?;
            sent.lock().unwrap_or_else(|e| e.into_inner()).push(write);
        }
        Ok(())
    }

    /// Starts a standby load balancer beside the tier's, on ports of its own.
    fn spawn_loadbalancer(&self, name: &str, log_dir: &Path) -> anyhow::Result<Component> {
        let ports = super::ready::free_ports(2)?;
        self.loadbalancer(name, (ports[0], ports[1]), log_dir)
    }
}

/// Waits until the controller has reconciled a write made at `acted` or later, and every write
/// made before: it works again.
async fn recovered(
    observed: &mut watch::Receiver<Observations>,
    sent: &Sent,
    acted: u64,
) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + BOUND;
    loop {
        let done = {
            let o = observed.borrow_and_update();
            let sent = sent.lock().unwrap_or_else(|e| e.into_inner());
            let seen =
                |(key, _, write): &&(String, u64, Write)| o.reconciled_after(key, *write).is_some();
            sent.iter()
                .filter(|(_, at, _)| *at >= acted)
                .any(|w| seen(&w))
                && sent
                    .iter()
                    .filter(|(_, at, _)| *at < acted)
                    .all(|w| seen(&w))
        };
        if done {
            return Ok(());
        }
        tokio::time::timeout_at(deadline, observed.changed())
            .await
            .map_err(|_| {
                anyhow::anyhow!("the controller did not reconcile again within {BOUND:?}")
            })?
            .context("the reconcile observer stopped")?;
    }
}

mod report;
mod running;
pub(crate) use report::{Figures, table};

#[cfg(test)]
mod tests;
