//! One run: one variant of the controller on one scenario's objects (in one namespace, or
//! spread over many; of one kind, or of several with the controllers spread over them), from
//! start to stop.

use std::{
    collections::{HashMap, HashSet},
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::Context as _;
use k8s_openapi::api::coordination::v1::Lease;
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams},
};
use kube_dispatch_bench::{ReconcileStart, now_micros};
use tokio::sync::{mpsc, watch};

use super::{
    admin::{counter_sum, http_status, scrape},
    apiserver::{ControlPlane, RequestCounts, cpu_profile, request_counts},
    objects::{self, Kind, change_value, object_name},
    process::{Component, Usage},
};

/// The tier runs plaintext and without authentication in these figures (`--insecure`,
/// `--allow-anonymous`), as it did before TLS and token reviews existed, so they stay comparable
/// with earlier runs. What security costs is measured on its own (`make bench-security`,
/// bench/results/security.md): within noise at p50.
pub(crate) const SECURITY_OFF: &str = "true";

/// The built binaries a run starts.
pub(crate) struct Binaries {
    pub(crate) dispatcher: PathBuf,
    pub(crate) loadbalancer: PathBuf,
    pub(crate) controller: PathBuf,
    /// The controller on controller-runtime (bench/controller-runtime), for its variants.
    pub(crate) controller_runtime: Option<PathBuf>,
    /// That controller ported to the Go SDK (bench/controller-runtime-dispatch), for the
    /// go-dispatch variants.
    pub(crate) controller_runtime_dispatch: Option<PathBuf>,
}

/// What every run of one scenario (kinds, object count, controllers) shares.
pub(crate) struct Setup<'a> {
    pub(crate) client: &'a Client,
    pub(crate) kubeconfig: &'a Path,
    pub(crate) binaries: &'a Binaries,
    pub(crate) control_plane: ControlPlane,
    /// The kinds of object, each with the same `objects` objects in the same namespaces.
    /// Controller group `g` reconciles every object of `kinds[g % kinds.len()]` (one kind, or a
    /// mix of resources: `--mix`), and the timed writes go to the kinds in turn, so there must
    /// be at least as many groups as kinds.
    pub(crate) kinds: &'a [Kind],
    /// The namespace of the objects when they are in one, and of the tier's Leases.
    pub(crate) namespace: &'a str,
    pub(crate) objects: usize,
    /// Namespaces the objects are spread over. With 1 they are all in `namespace`; with more,
    /// each of [`objects::Spread`]'s namespaces holds `objects / namespaces` of them, labelled,
    /// and every controller watches all namespaces with that label selector.
    pub(crate) namespaces: usize,
    /// Distinct controllers (controller groups), each reconciling every object: K processes
    /// of an incumbent, or K groups on one tier.
    pub(crate) groups: usize,
    /// Dispatchers in the tier of the `dispatch-*` variants.
    pub(crate) dispatchers: usize,
    pub(crate) writes: usize,
    pub(crate) write_interval: Duration,
    pub(crate) log_dir: &'a Path,
    /// The dispatchers' `--ring-key`, when not their default.
    pub(crate) ring_key: Option<&'a str>,
    /// Unique to this invocation, so every write changes the object even across invocations.
    pub(crate) nonce: u64,
    /// ConfigMaps each object (a Record) owns and the controller keeps (0: none). The timed
    /// writes then alternate: an owner (its children follow), a child (the drift repaired).
    pub(crate) children: usize,
    /// Records the timed writes' requests and an API-server CPU profile in the run's log
    /// directory (`--profile-apiserver`).
    pub(crate) profile_apiserver: bool,
}

/// A started tier: the dispatchers, then the load balancer.
pub(crate) struct Tier {
    pub(crate) components: Vec<Component>,
    /// The load balancer's port.
    pub(crate) lb_port: u16,
    /// Each dispatcher's admin port (`/metrics`), in the order of `components`.
    pub(crate) dispatcher_admin: Vec<u16>,
}

/// What one run measured.
#[derive(Clone, Debug)]
pub(crate) struct RunResult {
    pub(crate) variant: Variant,
    /// Each controller replica.
    pub(crate) replicas: Vec<Usage>,
    /// Each dispatcher (none for the kube-rs variants).
    pub(crate) dispatchers: Vec<Usage>,
    pub(crate) loadbalancer: Option<Usage>,
    /// Replica process start to the first reconcile starting.
    pub(crate) first_reconcile: Duration,
    /// Replica process start to every object having been reconciled at least once.
    pub(crate) all_reconciled: Duration,
    /// From every object having been reconciled to the API server being quiet again
    /// ([`super::apiserver::ControlPlane::quiet`]), when the timed writes begin.
    pub(crate) quiet_after: Duration,
    /// Per write: from sending it to the start of the first reconcile that saw it, microseconds.
    pub(crate) latencies_us: Vec<u64>,
    /// API requests on the objects' resource during the run, by verb; PATCH excludes the
    /// harness's own writes.
    pub(crate) requests: HashMap<&'static str, u64>,
    pub(crate) apiserver_cpu: f64,
    /// The part of `apiserver_cpu` spent until every controller had reconciled every object
    /// and the API server was quiet again: the lists, watches and reads of a cold start,
    /// before the timed writes.
    pub(crate) apiserver_cpu_cold: f64,
    pub(crate) etcd_cpu: f64,
    /// Reconciles started, in all.
    pub(crate) reconciles: u64,
    /// What the harness's own check that every child was repaired cost the API server (with
    /// `children`): its LIST requests and the API server's CPU meanwhile, taken out of the
    /// figures above.
    pub(crate) check: (u64, f64),
}

/// What the replicas' reconcile lines have shown so far.
#[derive(Default)]
struct Observations {
    first: Option<u64>,
    /// Per controller group, the objects it has reconciled, until it has reconciled them all.
    seen: Vec<HashSet<String>>,
    /// Per group, whether it has reconciled every object.
    complete: Vec<bool>,
    /// Groups that have reconciled every object.
    done: usize,
    /// When the last group had reconciled every object.
    all: Option<u64>,
    total: u64,
    /// Per group, the reconcile starts of the keys the latency phase writes in the group's
    /// kind: (when, resourceVersion).
    written: Vec<HashMap<String, Vec<(u64, u64)>>>,
}

impl Observations {
    /// When every group that reconciles `key`'s kind had started a reconcile of `key` after
    /// `write`; None until then, and if no group follows `key`.
    fn reconciled_after(&self, key: &str, write: Write) -> Option<u64> {
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
enum Write {
    /// The object itself, at this resourceVersion: the reconcile that saw it or later.
    Object(u64),
    /// A child of the object, at this instant (micros): the owner's first reconcile after.
    Child(u64),
}

pub(crate) const VERBS: [&str; 5] = ["LIST", "WATCH", "GET", "PATCH", "APPLY"];
mod processes;
mod ready;
mod variant;

use ready::*;
pub(crate) use variant::{ListMode, Variant};

impl Setup<'_> {
    /// The kind controller group `group` reconciles.
    pub(crate) fn group_kind(&self, group: usize) -> Kind {
        self.kinds[group % self.kinds.len()]
    }

    /// The kind the `n`th timed write changes: the kinds in turn.
    fn write_kind(&self, n: usize) -> Kind {
        self.kinds[n % self.kinds.len()]
    }

    /// The kinds' `--kind` flags, joined: a name for logs and files.
    pub(crate) fn kinds_flag(&self) -> String {
        objects::flags(self.kinds)
    }

    /// The namespace of the `i`th object and its index there.
    pub(crate) fn place(&self, i: usize) -> (String, usize) {
        match self.spread() {
            None => (self.namespace.to_owned(), i),
            Some(spread) => spread.place(i),
        }
    }

    pub(crate) fn key(&self, i: usize) -> String {
        let (namespace, i) = self.place(i);
        format!("{namespace}/{}", object_name(i))
    }

    /// How the objects are spread over namespaces, when they are.
    pub(crate) fn spread(&self) -> Option<objects::Spread> {
        (self.namespaces > 1)
            .then(|| objects::Spread::new(self.objects, self.namespaces, self.children))
    }

    /// The label selector of a scenario spread over namespaces.
    pub(crate) fn selector(&self) -> Option<String> {
        self.spread().map(|spread| spread.selector())
    }

    /// The objects the latency phase writes, spread over the namespace.
    fn written_objects(&self) -> Vec<usize> {
        let n = self.writes.min(self.objects);
        (0..n).map(|i| i * self.objects / n).collect()
    }

    /// Runs `variant` once; `run` numbers the runs so each writes values never written before.
    pub(crate) async fn run(&self, variant: Variant, run: usize) -> anyhow::Result<RunResult> {
        anyhow::ensure!(
            !self.kinds.is_empty() && self.groups >= self.kinds.len(),
            "{} controllers cannot cover {} kinds",
            self.groups,
            self.kinds.len()
        );
        let log_dir = self.log_dir.join(format!(
            "{}-{}x{}-{}-{variant}-{run}",
            self.kinds_flag(),
            self.objects,
            self.namespaces,
            self.groups
        ));
        std::fs::create_dir_all(&log_dir)
            .with_context(|| format!("cannot create {}", log_dir.display()))?;
        // Watches of processes an earlier run (or test) stopped are counted only once the API
        // server sees them end: let those land before this run's count starts.
        let requests_before = settled_request_counts(self.client).await?;
        let cpu_before = self.control_plane.cpu_seconds();

        let mut tier = Vec::new();
        let mut lb_port = 0;
        if variant.on_tier() {
            let started = self.start_tier(&log_dir, variant.list_mode()).await?;
            (tier, lb_port) = (started.components, started.lb_port);
        }

        let written = self.written_objects();
        let groups = self.groups;
        let (observed_tx, observed) = watch::channel(Observations {
            seen: vec![HashSet::new(); groups],
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
        // Bounded: a replica that prints faster than this is read waits on its stdout pipe.
        let (tx, mut rx) = mpsc::channel::<(usize, ReconcileStart)>(4096);
        let objects = self.objects;
        // In one namespace, only its objects count; spread over many, the label selector
        // already keeps the controllers to the scenario's objects.
        let prefix = match self.selector() {
            None => format!("{}/obj-", self.namespace),
            Some(_) => String::new(),
        };
        let observer = tokio::spawn(async move {
            while let Some((group, start)) = rx.recv().await {
                observed_tx.send_modify(|o| {
                    o.total += 1;
                    o.first.get_or_insert(start.at_micros);
                    if let Some(starts) = o.written[group].get_mut(&start.key) {
                        starts.push((start.at_micros, start.resource_version));
                    }
                    if !o.complete[group] && start.key.starts_with(&prefix) {
                        o.seen[group].insert(start.key.clone());
                        if o.seen[group].len() == objects {
                            o.complete[group] = true;
                            o.seen[group] = HashSet::new();
                            o.done += 1;
                            if o.done == groups {
                                o.all = Some(start.at_micros);
                            }
                        }
                    }
                });
            }
        });

        let started = now_micros();
        let replicas = self.start_replicas(variant, lb_port, &log_dir, &tx)?;
        drop(tx);
        let result = self
            .measure(
                variant,
                run,
                (started, cpu_before.0),
                &written,
                observed,
                replicas,
                tier,
                &log_dir,
            )
            .await;
        observer.abort();
        let mut result = result?;

        let requests_after = settled_request_counts(self.client).await?;
        let cpu_after = self.control_plane.cpu_seconds();
        let mut resources: Vec<&str> = self.kinds.iter().map(|k| k.resource()).collect();
        if self.children > 0 {
            resources.push(Kind::ConfigMap.resource());
        }
        resources.sort_unstable();
        resources.dedup();
        for verb in VERBS {
            let mut n: u64 = resources
                .iter()
                .map(|resource| requests_after.since(&requests_before, resource, verb))
                .sum();
            if verb == "PATCH" {
                n = n.saturating_sub(written.len() as u64);
            }
            if verb == "LIST" {
                n = n.saturating_sub(result.check.0);
            }
            result.requests.insert(verb, n);
        }
        result.apiserver_cpu = cpu_after.0 - cpu_before.0 - result.check.1;
        result.etcd_cpu = cpu_after.1 - cpu_before.1;
        Ok(result)
    }

    #[allow(clippy::too_many_arguments)]
    async fn measure(
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
        let bound = Duration::from_secs(60)
            + Duration::from_millis(2 * (self.objects * self.groups) as u64);
        // A process that exits meanwhile (an incumbent giving up on its cache sync, say) fails
        // the run at once rather than at the bound. (Never an empty set: a run starts one
        // replica at least.)
        let waited = {
            let exited = futures::future::select_all(
                replicas
                    .iter_mut()
                    .chain(tier.iter_mut())
                    .map(|c| Box::pin(c.exited())),
            );
            tokio::select! {
                r = tokio::time::timeout(bound, observed.wait_for(|o| o.all.is_some())) => {
                    r.map(|r| r.map(|o| (o.first.unwrap_or(started), o.all.unwrap_or(started))))
                }
                (error, ..) = exited => {
                    return Err(error.context(format!("{variant}: before every object was reconciled")));
                }
            }
        };
        let (first, all) = match waited {
            Ok(Ok(times)) => times,
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
                replicas
                    .first()
                    .map_or(Path::new(""), |r| r.log.as_path())
                    .display()
            ),
        };
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

        // The latency phase: the same objects, at the same pace, in every run.
        let mut sent = Vec::with_capacity(written.len());
        let mut ticks = tokio::time::interval(self.write_interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        for (n, i) in written.iter().enumerate() {
            ticks.tick().await;
            let (namespace, index) = self.place(*i);
            let value = format!("{}-{variant}-{run}-{n}", self.nonce);
            let at = now_micros();
            let write = if self.children > 0 && n % 2 == 1 {
                objects::drift_child(self.client, &namespace, index, n % self.children, &value)
                    .await
                    .with_context(|| format!("write {n} (a child) failed"))?;
                Write::Child(at)
            } else {
                let rv = change_value(self.client, self.write_kind(n), &namespace, index, &value)
                    .await
                    .with_context(|| format!("write {n} failed"))?;
                Write::Object(rv)
            };
            sent.push((self.key(*i), at, write));
        }
        let reconciled_after =
            |o: &Observations, key: &str, write: Write| o.reconciled_after(key, write);
        tokio::time::timeout(
            Duration::from_secs(60),
            observed.wait_for(|o| {
                sent.iter()
                    .all(|(key, _, write)| reconciled_after(o, key, *write).is_some())
            }),
        )
        .await
        .map_err(|_| anyhow::anyhow!("{variant}: some writes were not reconciled within 60 s"))?
        .context("the observer stopped")?;
        let (latencies_us, reconciles) = {
            let o = observed.borrow();
            let latencies: Vec<u64> = sent
                .iter()
                .filter_map(|(key, at, write)| {
                    Some(reconciled_after(&o, key, *write)?.saturating_sub(*at))
                })
                .collect();
            anyhow::ensure!(latencies.len() == sent.len(), "a write lost its reconcile");
            (latencies, o.total)
        };
        // Each write's latency, in the order written, for looking into a percentile.
        let listing: String = sent
            .iter()
            .zip(&latencies_us)
            .map(|((key, at, write), us)| format!("{at} {key} {write:?} {us}\n"))
            .collect();
        let path = log_dir.join("latencies.txt");
        std::fs::write(&path, listing)
            .with_context(|| format!("cannot write {}", path.display()))?;
        let check = self.children_repaired(variant).await?;
        if let Some(profile) = profile {
            let requests = request_counts(self.client)
                .await?
                .changes_since(&requests_quiet);
            let path = log_dir.join("requests-timed.txt");
            std::fs::write(&path, requests)
                .with_context(|| format!("cannot write {}", path.display()))?;
            let profile = profile.await.context("the profile task failed")??;
            let path = log_dir.join("apiserver-timed.pprof");
            std::fs::write(&path, profile)
                .with_context(|| format!("cannot write {}", path.display()))?;
        }

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
            etcd_cpu: 0.0,
            reconciles,
            check,
        })
    }

    /// With `children`: waits until every child holds what its owner says (the writes to
    /// children repaired, those to owners followed), failing the run after 60 s. Returns the
    /// LIST requests and the API server's CPU that took.
    async fn children_repaired(&self, variant: Variant) -> anyhow::Result<(u64, f64)> {
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

/// The API server's request counts once they stop moving (for at most 3 s): a watch is counted
/// when it ends, some time after its process was killed.
async fn settled_request_counts(client: &Client) -> anyhow::Result<RequestCounts> {
    let mut counts = request_counts(client).await?;
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let again = request_counts(client).await?;
        if again == counts {
            break;
        }
        counts = again;
    }
    Ok(counts)
}

/// The controller group name of group `group`: the one group of a single-controller run keeps
/// the name it always had.
fn group_name(group: usize) -> String {
    if group == 0 {
        "bench-controller".to_owned()
    } else {
        format!("bench-controller-{group}")
    }
}

#[cfg(test)]
mod tests;
