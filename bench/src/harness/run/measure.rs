//! A run's measurement: the replicas' reconcile starts followed as they print them, the cold
//! start awaited, the timed writes made and matched with the reconciles that saw them, and what
//! each process used.

use std::{
    collections::{HashMap, HashSet},
    path::Path,
    time::Duration,
};

use anyhow::Context as _;
use kube_dispatch_bench::{ReconcileStart, now_micros};
use tokio::{
    sync::{mpsc, watch},
    task::JoinHandle,
};

use super::{RunResult, Setup, Variant};
use crate::harness::{
    apiserver::{cpu_profile, request_counts},
    objects::{self, change_value},
    process::{Component, Usage},
};

/// What the replicas' reconcile lines have shown so far.
#[derive(Default)]
pub(super) struct Observations {
    /// The earliest reconcile start seen (lines arrive in their order per process only).
    first: Option<u64>,
    /// Per controller group, the objects it has reconciled, until it has reconciled them all.
    seen: Vec<HashSet<String>>,
    /// Per group, the latest start of the reconciles that first showed it an object: when it
    /// had reconciled them all, once it has.
    latest: Vec<u64>,
    /// Per group, whether it has reconciled every object.
    complete: Vec<bool>,
    /// Groups that have reconciled every object.
    done: usize,
    /// When the last group had reconciled every object: the latest of their `latest`.
    all: Option<u64>,
    total: u64,
    /// Per group, the reconcile starts of the keys the latency phase writes in the group's
    /// kind: (when, resourceVersion).
    written: Vec<HashMap<String, Vec<(u64, u64)>>>,
}

impl Observations {
    /// When every group that reconciles `key`'s kind had started a reconcile of `key` after
    /// `write`; None until then, and if no group follows `key`.
    pub(super) fn reconciled_after(&self, key: &str, write: Write) -> Option<u64> {
        let mut latest = None;
        for starts in self.written.iter().filter_map(|group| group.get(key)) {
            let at = starts
                .iter()
                .filter(|(at, r)| match write {
                    Write::Object(rv) => *r >= rv,
                    Write::Child(written) => *at >= written,
                })
                .map(|(at, _)| *at)
                .min()?;
            latest = Some(latest.map_or(at, |l: u64| l.max(at)));
        }
        latest
    }
}

/// A timed write, as its reconcile is recognised.
#[derive(Clone, Copy, Debug)]
pub(super) enum Write {
    /// The object itself, at this resourceVersion: the reconcile that saw it or later.
    Object(u64),
    /// A child of the object, at this instant (micros): the owner's first reconcile after.
    Child(u64),
}

/// The timed writes, in the order made: each object's key, when (micros), and what was written.
type Sent = Vec<(String, u64, Write)>;

/// Most reconcile-start lines the observer takes at once.
const OBSERVED_AT_ONCE: usize = 1024;

impl Setup<'_> {
    /// Follows the reconcile starts the replicas send on the returned sender until it closes
    /// (bounded: a replica whose lines are read slower than it prints them waits on its stdout
    /// pipe once a MiB of them is waiting).
    pub(super) fn observe(
        &self,
        written: &[usize],
    ) -> (
        mpsc::Sender<(usize, ReconcileStart)>,
        watch::Receiver<Observations>,
        JoinHandle<()>,
    ) {
        let groups = self.groups;
        let (observed_tx, observed) = watch::channel(Observations {
            seen: vec![HashSet::new(); groups],
            latest: vec![0; groups],
            complete: vec![false; groups],
            // Each group follows the writes to its kind.
            written: (0..groups)
                .map(|g| {
                    written
                        .iter()
                        .enumerate()
                        .filter(|(n, _)| self.write_kind(*n) == self.group_kind(g))
                        .map(|(_, i)| (self.key(*i), Vec::new()))
                        .collect()
                })
                .collect(),
            ..Observations::default()
        });
        let (tx, mut rx) = mpsc::channel::<(usize, ReconcileStart)>(4096);
        let objects = self.objects;
        // In one namespace, only its objects count; spread over many, the label selector
        // already keeps the controllers to the scenario's objects.
        let prefix = match self.selector() {
            None => format!("{}/obj-", self.namespace),
            Some(_) => String::new(),
        };
        // The lines waiting are taken together, and those waiting on the observations woken
        // once for them, not once a line (bench/METHOD.md, "What each figure means").
        let observer = tokio::spawn(async move {
            let mut batch = Vec::with_capacity(OBSERVED_AT_ONCE);
            while rx.recv_many(&mut batch, OBSERVED_AT_ONCE).await > 0 {
                observed_tx.send_modify(|o| {
                    for (group, start) in batch.drain(..) {
                        o.total += 1;
                        o.first = Some(o.first.map_or(start.at_micros, |f| f.min(start.at_micros)));
                        if let Some(starts) = o.written[group].get_mut(&start.key) {
                            starts.push((start.at_micros, start.resource_version));
                        }
                        if !o.complete[group]
                            && start.key.starts_with(&prefix)
                            && o.seen[group].insert(start.key)
                        {
                            o.latest[group] = o.latest[group].max(start.at_micros);
                            if o.seen[group].len() == objects {
                                o.complete[group] = true;
                                o.seen[group] = HashSet::new();
                                o.done += 1;
                                if o.done == groups {
                                    o.all = o.latest.iter().copied().max();
                                }
                            }
                        }
                    }
                });
            }
        });
        (tx, observed, observer)
    }

    /// Measures a run whose replicas and tier were started at `started` (micros, with the API
    /// server's CPU seconds then): the cold start, then the timed writes of `written`; stops
    /// every process.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn measure(
        &self,
        variant: Variant,
        run: usize,
        (started, apiserver_cpu_before): (u64, f64),
        written: &[usize],
        mut observed: watch::Receiver<Observations>,
        mut replicas: Vec<Component>,
        mut tier: Vec<Component>,
        log_dir: &Path,
    ) -> anyhow::Result<RunResult> {
        let (first, all) = self
            .cold_start(variant, started, &mut observed, &mut replicas, &mut tier)
            .await?;
        // The cold start's work ends when the API server is quiet again, not when the last
        // reconcile starts: the reads still in flight and the garbage they made are the cold
        // start's, not the timed writes'. Every variant waits alike.
        let settled = self.control_plane.quiet().await;
        let apiserver_cpu_cold = self.control_plane.cpu_seconds().0 - apiserver_cpu_before;
        let requests_quiet = request_counts(self.client).await?;
        let profile = self.profile_apiserver.then(|| {
            let client = self.client.clone();
            // The writes take `writes × interval`; their reconciles and the repair a little more.
            let seconds = (self.write_interval * u32::try_from(written.len()).unwrap_or(u32::MAX))
                .as_secs()
                + 3;
            tokio::spawn(async move { cpu_profile(&client, seconds).await })
        });

        let sent = self.timed_writes(variant, run, written).await?;
        let (latencies_us, reconciles) = latencies(&mut observed, &sent, Duration::from_secs(60))
            .await
            .with_context(|| format!("{variant}"))?;
        let apiserver_cpu_writes =
            self.control_plane.cpu_seconds().0 - apiserver_cpu_before - apiserver_cpu_cold;
        // Each write's latency, in the order written, for looking into a percentile.
        let listing: String = sent
            .iter()
            .zip(&latencies_us)
            .map(|((key, at, write), us)| format!("{at} {key} {write:?} {us}\n"))
            .collect();
        write_file(&log_dir.join("latencies.txt"), listing)?;
        let check = self.children_repaired(variant).await?;
        if let Some(profile) = profile {
            let requests = request_counts(self.client)
                .await?
                .changes_since(&requests_quiet);
            write_file(&log_dir.join("requests-timed.txt"), requests)?;
            let profile = profile.await.context("the profile task failed")??;
            write_file(&log_dir.join("apiserver-timed.pprof"), profile)?;
        }
        let (replica_usage, dispatchers, loadbalancer) = stop(replicas, tier).await?;

        Ok(RunResult {
            variant,
            replicas: replica_usage,
            dispatchers,
            loadbalancer,
            first_reconcile: Duration::from_micros(first.saturating_sub(started)),
            all_reconciled: Duration::from_micros(all.saturating_sub(started)),
            quiet_after: settled,
            latencies_us,
            requests: HashMap::new(),
            apiserver_cpu: 0.0,
            apiserver_cpu_cold,
            apiserver_cpu_writes,
            etcd_cpu: 0.0,
            reconciles,
            check,
        })
    }

    /// Waits until every controller group has reconciled every object: when the first and the
    /// last of those reconciles started (micros). A process that exits meanwhile (an incumbent
    /// giving up on its cache sync, say) fails the run at once rather than at the bound.
    pub(super) async fn cold_start(
        &self,
        variant: Variant,
        started: u64,
        observed: &mut watch::Receiver<Observations>,
        replicas: &mut [Component],
        tier: &mut [Component],
    ) -> anyhow::Result<(u64, u64)> {
        let bound = Duration::from_secs(60)
            + Duration::from_millis(2 * (self.objects * self.groups) as u64);
        let log = replicas
            .first()
            .map_or(Path::new("").to_owned(), |r| r.log.clone());
        // Never an empty set: a run starts one replica at least.
        let exited = futures::future::select_all(
            replicas
                .iter_mut()
                .chain(tier.iter_mut())
                .map(|c| Box::pin(c.exited())),
        );
        let waited = tokio::select! {
            r = tokio::time::timeout(bound, observed.wait_for(|o| o.all.is_some())) => {
                r.map(|r| r.map(|o| (o.first.unwrap_or(started), o.all.unwrap_or(started))))
            }
            (error, ..) = exited => {
                return Err(error.context(format!("{variant}: before every object was reconciled")));
            }
        };
        match waited {
            Ok(Ok(times)) => Ok(times),
            Ok(Err(_)) => anyhow::bail!("{variant}: the reconcile observer stopped"),
            Err(_) => anyhow::bail!(
                "{variant}: {} of {} controllers reconciled all {} objects within {bound:?} (the others: {:?}); logs in {}",
                observed.borrow().done,
                self.groups,
                self.objects,
                observed
                    .borrow()
                    .seen
                    .iter()
                    .map(HashSet::len)
                    .filter(|n| *n > 0)
                    .collect::<Vec<_>>(),
                log.display()
            ),
        }
    }

    /// The latency phase's writes: the same objects, at the same pace, in every run.
    async fn timed_writes(
        &self,
        variant: Variant,
        run: usize,
        written: &[usize],
    ) -> anyhow::Result<Sent> {
        let mut sent = Vec::with_capacity(written.len());
        let mut ticks = tokio::time::interval(self.write_interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        for (n, i) in written.iter().enumerate() {
            ticks.tick().await;
            let value = format!("{}-{variant}-{run}-{n}", self.nonce);
            sent.push(self.write(n, *i, &value).await?);
        }
        Ok(sent)
    }

    /// The `n`th write of a series, to object `i`: its value changed to `value` (with
    /// `children`, every other write changes one of its children instead, which the controller
    /// repairs). Returns the object's key, when it was written (micros) and what was written.
    pub(super) async fn write(
        &self,
        n: usize,
        i: usize,
        value: &str,
    ) -> anyhow::Result<(String, u64, Write)> {
        let (namespace, index) = self.place(i);
        let at = now_micros();
        let write = if self.children > 0 && n % 2 == 1 {
            objects::drift_child(self.client, &namespace, index, n % self.children, value)
                .await
                .with_context(|| format!("write {n} (a child) failed"))?;
            Write::Child(at)
        } else {
            let rv = change_value(self.client, self.write_kind(n), &namespace, index, value)
                .await
                .with_context(|| format!("write {n} failed"))?;
            Write::Object(rv)
        };
        Ok((self.key(i), at, write))
    }

    /// With `children`: waits until every child holds what its owner says (the writes to
    /// children repaired, those to owners followed), failing the run after 60 s. Returns the
    /// LIST requests and the API server's CPU that took.
    pub(super) async fn children_repaired(&self, variant: Variant) -> anyhow::Result<(u64, f64)> {
        if self.children == 0 {
            return Ok((0, 0.0));
        }
        let before = self.control_plane.cpu_seconds().0;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        // Each namespace's owners and children: the one namespace, or every one of the spread.
        let namespaces: Vec<(String, usize)> = match self.spread() {
            None => vec![(self.namespace.to_owned(), self.objects)],
            Some(spread) => (0..spread.namespaces)
                .map(|i| (spread.namespace(i), spread.per))
                .collect(),
        };
        let mut lists = 0;
        loop {
            // The last write's reconcile has started; give it time to finish before reading.
            tokio::time::sleep(Duration::from_millis(200)).await;
            let mut current = true;
            for (namespace, count) in &namespaces {
                let (all, n) =
                    objects::children_current(self.client, namespace, *count, self.children)
                        .await?;
                lists += n;
                if !all {
                    current = false;
                    break;
                }
            }
            if current {
                return Ok((lists, self.control_plane.cpu_seconds().0 - before));
            }
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "{variant}: some children were not as their owners say 60 s after the last write"
            );
        }
    }
}

/// Waits (`bound` at most) until every write in `sent` has been reconciled: each write's
/// latency (micros, in the order written) and the reconciles started in all.
pub(super) async fn latencies(
    observed: &mut watch::Receiver<Observations>,
    sent: &[(String, u64, Write)],
    bound: Duration,
) -> anyhow::Result<(Vec<u64>, u64)> {
    tokio::time::timeout(
        bound,
        observed.wait_for(|o| {
            sent.iter()
                .all(|(key, _, write)| o.reconciled_after(key, *write).is_some())
        }),
    )
    .await
    .map_err(|_| anyhow::anyhow!("some writes were not reconciled within {bound:?}"))?
    .context("the reconcile observer stopped")?;
    let o = observed.borrow();
    let latencies: Vec<u64> = sent
        .iter()
        .filter_map(|(key, at, write)| Some(o.reconciled_after(key, *write)?.saturating_sub(*at)))
        .collect();
    anyhow::ensure!(latencies.len() == sent.len(), "a write lost its reconcile");
    Ok((latencies, o.total))
}

/// What each process used (replicas; dispatchers and load balancer), then every process
/// killed.
async fn stop(
    mut replicas: Vec<Component>,
    mut tier: Vec<Component>,
) -> anyhow::Result<(Vec<Usage>, Vec<Usage>, Option<Usage>)> {
    let mut replica_usage = Vec::new();
    for r in &mut replicas {
        replica_usage.push(r.usage()?);
    }
    let mut dispatchers = Vec::new();
    let mut loadbalancer = None;
    for c in &mut tier {
        let usage = c.usage()?;
        if c.name == "loadbalancer" {
            loadbalancer = Some(usage);
        } else {
            dispatchers.push(usage);
        }
    }
    // Killed, not stopped: a graceful stop of the whole tier at once is a scale-down, in
    // which each dispatcher re-lists as the others leave, and that is not what is measured.
    futures::future::join_all(replicas.into_iter().chain(tier).map(Component::kill)).await;
    Ok((replica_usage, dispatchers, loadbalancer))
}

/// Writes `contents` to `path`, saying which file could not be written.
fn write_file(path: &Path, contents: impl AsRef<[u8]>) -> anyhow::Result<()> {
    std::fs::write(path, contents).with_context(|| format!("cannot write {}", path.display()))
}

#[cfg(test)]
mod tests;
