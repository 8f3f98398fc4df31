//! One run: one variant of the controller on one scenario's objects (in one namespace, or
//! spread over many; of one kind, or of several with the controllers spread over them), from
//! start to stop.

use std::{
    collections::{HashMap, HashSet},
    fmt,
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

/// How the controller runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Variant {
    /// kube-rs `Controller`, reflector cache of whole objects.
    KubeRs,
    /// The same, its watcher listing by streaming (`watcher::Config::streaming_lists`: one
    /// WATCH with `sendInitialEvents`, served from the API server's watch cache) instead of
    /// pages of 500: what kube-rs users turn to for large collections.
    KubeRsStreaming,
    /// kube-rs `Controller`, metadata-only watch and cache, GET per reconcile.
    KubeRsMetadata,
    /// controller-runtime (Go), its default cache of whole objects.
    ControllerRuntime,
    /// controller-runtime (Go), `builder.OnlyMetadata`: metadata-only cache, GET per reconcile.
    ControllerRuntimeMetadata,
    /// The SDK behind the dispatchers and the load balancer, with this many replicas.
    Dispatch(usize),
    /// As [`Variant::Dispatch`], the dispatchers listing in another mode than their default
    /// whole lists (`--list-mode`).
    DispatchListing(ListMode, usize),
    /// As [`Variant::Dispatch`], each reconcile listing its children instead of reading them
    /// from its request (`--children`).
    DispatchList(usize),
    /// The controller-runtime controller ported to the Go SDK
    /// (`bench/controller-runtime-dispatch`), with this many replicas, on the tier.
    GoDispatch(usize),
}

/// How the dispatchers of a [`Variant::DispatchListing`] list (`--list-mode` of
/// kube-dispatch-dispatcher, whose default is one whole LIST).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum ListMode {
    /// LIST in pages of 500.
    Paged,
    /// One WATCH with `sendInitialEvents`.
    Stream,
}

impl ListMode {
    /// The dispatcher's `--list-mode` value.
    pub(crate) fn flag(self) -> &'static str {
        match self {
            ListMode::Paged => "paged",
            ListMode::Stream => "stream",
        }
    }
}

impl Variant {
    /// Whether it runs on the tier (dispatchers and load balancer).
    pub(crate) fn on_tier(self) -> bool {
        matches!(
            self,
            Variant::Dispatch(_)
                | Variant::DispatchList(_)
                | Variant::GoDispatch(_)
                | Variant::DispatchListing(..)
        )
    }

    /// The Rust SDK with one replica, whatever its dispatchers' list mode: what the
    /// incumbents' figures are divided by.
    pub(crate) fn is_sdk_alone(self) -> bool {
        matches!(self, Variant::Dispatch(1) | Variant::DispatchListing(_, 1))
    }

    /// The dispatchers' `--list-mode`, when not their default.
    pub(crate) fn list_mode(self) -> Option<ListMode> {
        match self {
            Variant::DispatchListing(mode, _) => Some(mode),
            _ => None,
        }
    }
}

impl fmt::Display for Variant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Variant::KubeRs => f.write_str("kube-rs"),
            Variant::KubeRsStreaming => f.write_str("kube-rs-streaming"),
            Variant::KubeRsMetadata => f.write_str("kube-rs-metadata"),
            Variant::ControllerRuntime => f.write_str("controller-runtime"),
            Variant::ControllerRuntimeMetadata => f.write_str("controller-runtime-metadata"),
            Variant::Dispatch(n) => write!(f, "dispatch-{n}"),
            Variant::DispatchList(n) => write!(f, "dispatch-list-{n}"),
            Variant::GoDispatch(n) => write!(f, "go-dispatch-{n}"),
            Variant::DispatchListing(mode, n) => write!(f, "dispatch-{}-{n}", mode.flag()),
        }
    }
}

impl std::str::FromStr for Variant {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "kube-rs" => Ok(Variant::KubeRs),
            "kube-rs-streaming" => Ok(Variant::KubeRsStreaming),
            "kube-rs-metadata" => Ok(Variant::KubeRsMetadata),
            "controller-runtime" => Ok(Variant::ControllerRuntime),
            "controller-runtime-metadata" => Ok(Variant::ControllerRuntimeMetadata),
            _ => {
                let replicas = |n: &str| n.parse().ok().filter(|n| (1..=64).contains(n));
                if let Some(n) = s.strip_prefix("go-dispatch-") {
                    replicas(n).map(Variant::GoDispatch)
                } else if let Some(n) = s.strip_prefix("dispatch-list-") {
                    replicas(n).map(Variant::DispatchList)
                } else if let Some(n) = s.strip_prefix("dispatch-paged-") {
                    replicas(n).map(|n| Variant::DispatchListing(ListMode::Paged, n))
                } else if let Some(n) = s.strip_prefix("dispatch-stream-") {
                    replicas(n).map(|n| Variant::DispatchListing(ListMode::Stream, n))
                } else {
                    s.strip_prefix("dispatch-").and_then(replicas).map(Variant::Dispatch)
                }
                .ok_or_else(|| {
                    format!(
                        "unknown variant {s:?}: expected kube-rs, kube-rs-streaming, kube-rs-metadata, controller-runtime, controller-runtime-metadata, dispatch-<replicas 1..=64>, dispatch-paged-<replicas 1..=64>, dispatch-stream-<replicas 1..=64>, dispatch-list-<replicas 1..=64> or go-dispatch-<replicas 1..=64>"
                    )
                })
            }
        }
    }
}

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

    pub(crate) fn start_replicas(
        &self,
        variant: Variant,
        lb_port: u16,
        log_dir: &Path,
        tx: &mpsc::Sender<(usize, ReconcileStart)>,
    ) -> anyhow::Result<Vec<Component>> {
        let mut args: Vec<String> = Vec::new();
        match self.selector() {
            None => args.extend(["--namespace".to_owned(), self.namespace.to_owned()]),
            Some(selector) => args.extend([
                "--namespace".to_owned(),
                String::new(),
                "--selector".to_owned(),
                selector,
            ]),
        }
        let (program, count) = match variant {
            Variant::ControllerRuntime | Variant::ControllerRuntimeMetadata => {
                if variant == Variant::ControllerRuntimeMetadata {
                    args.push("--metadata".to_owned());
                }
                let program = self.binaries.controller_runtime.as_ref().context(
                    "the controller-runtime variants need --controller-runtime (bench/controller-runtime/build.sh builds it)",
                )?;
                (program, 1)
            }
            Variant::GoDispatch(n) => {
                let program = self.binaries.controller_runtime_dispatch.as_ref().context(
                    "the go-dispatch variants need --controller-runtime-dispatch (bench/controller-runtime/build.sh dispatch builds it)",
                )?;
                (program, n)
            }
            Variant::KubeRs
            | Variant::KubeRsStreaming
            | Variant::KubeRsMetadata
            | Variant::Dispatch(_)
            | Variant::DispatchList(_)
            | Variant::DispatchListing(..) => {
                let (runtime, count) = match variant {
                    Variant::KubeRsMetadata => ("kube-rs-metadata", 1),
                    Variant::KubeRsStreaming => ("kube-rs-streaming", 1),
                    Variant::Dispatch(n)
                    | Variant::DispatchList(n)
                    | Variant::DispatchListing(_, n) => ("dispatch", n),
                    _ => ("kube-rs", 1),
                };
                args.extend(["--runtime".to_owned(), runtime.to_owned()]);
                if self.children > 0 {
                    let from = match variant {
                        Variant::DispatchList(_) => "list",
                        _ => "request",
                    };
                    args.extend(["--children-from".to_owned(), from.to_owned()]);
                }
                (&self.binaries.controller, count)
            }
        };
        if self.children > 0 {
            args.extend(["--children".to_owned(), self.children.to_string()]);
        }
        let mut replicas = Vec::new();
        for group in 0..self.groups {
            // Each group's reconcile lines, tagged with the group.
            let (group_tx, mut group_rx) = mpsc::channel::<ReconcileStart>(1024);
            let tx = tx.clone();
            tokio::spawn(async move {
                while let Some(start) = group_rx.recv().await {
                    if tx.send((group, start)).await.is_err() {
                        break;
                    }
                }
            });
            let args = [
                ["--kind", self.group_kind(group).flag()]
                    .map(str::to_owned)
                    .as_slice(),
                &args,
            ]
            .concat();
            for i in 0..count {
                let name = if self.groups == 1 {
                    format!("bench-controller-{i}")
                } else {
                    format!("bench-controller-{group}-{i}")
                };
                let env = [
                    ("KUBECONFIG", self.kubeconfig.display().to_string()),
                    ("POD_NAME", name.clone()),
                    ("KD_BENCH_NAME", group_name(group)),
                    ("KD_LOADBALANCER", format!("127.0.0.1:{lb_port}")),
                    ("KD_INSECURE", SECURITY_OFF.to_owned()),
                    ("KD_ALLOW_ANONYMOUS", SECURITY_OFF.to_owned()),
                ];
                replicas.push(Component::spawn(
                    &name,
                    program,
                    &args,
                    &env,
                    log_dir,
                    Some(group_tx.clone()),
                )?);
            }
        }
        Ok(replicas)
    }

    /// Starts the dispatchers (listing in `list_mode`, or their default) and the load
    /// balancer, and waits until the ring holds all the dispatchers, their handover is
    /// complete and the load balancer leads and knows them.
    pub(crate) async fn start_tier(
        &self,
        log_dir: &Path,
        list_mode: Option<ListMode>,
    ) -> anyhow::Result<Tier> {
        // Leases a previous, interrupted run left would hold the new ring back.
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), self.namespace);
        leases
            .delete_collection(&DeleteParams::default(), &ListParams::default())
            .await
            .context("cannot clear the Leases of earlier runs")?;
        let kubeconfig = self.kubeconfig.display().to_string();
        let mut tier = Vec::new();
        let ids: Vec<String> = (0..self.dispatchers)
            .map(|i| format!("dispatcher-{i}"))
            .collect();
        // Every port at once, so no two are the same: one picked and released could be picked
        // again before the process it was meant for binds it.
        let mut ports = free_ports(2 * ids.len() + 2)?.into_iter();
        let mut next_port = || ports.next().context("fewer free ports than asked for");
        let mut dispatcher_admin = Vec::new();
        for id in &ids {
            let (port, admin) = (next_port()?, next_port()?);
            dispatcher_admin.push(admin);
            let mut env = vec![
                ("KUBECONFIG", kubeconfig.clone()),
                ("KD_DISPATCHER_ID", id.clone()),
                ("KD_LISTEN", format!("127.0.0.1:{port}")),
                ("KD_ADMIN_LISTEN", format!("127.0.0.1:{admin}")),
                ("KD_LEASE_NAMESPACE", self.namespace.to_owned()),
                // kube-rs controllers do not resync by default either: the same work.
                ("KD_RESYNC_INTERVAL", "0s".to_owned()),
                ("KD_LOG_JSON", "1".to_owned()),
                ("KD_INSECURE", SECURITY_OFF.to_owned()),
                ("KD_ALLOW_ANONYMOUS", SECURITY_OFF.to_owned()),
            ];
            if let Some(ring_key) = self.ring_key {
                env.push(("KD_RING_KEY", ring_key.to_owned()));
            }
            // Always named: a KD_LIST_MODE in the benchmark's own environment would otherwise
            // reach the dispatchers of every variant.
            env.push((
                "KD_LIST_MODE",
                list_mode.map_or("whole", ListMode::flag).to_owned(),
            ));
            tier.push(Component::spawn(
                id,
                &self.binaries.dispatcher,
                &[],
                &env,
                log_dir,
                None,
            )?);
        }
        let (lb_port, lb_admin) = (next_port()?, next_port()?);
        let env = [
            ("KUBECONFIG", kubeconfig.clone()),
            ("KD_LISTEN", format!("127.0.0.1:{lb_port}")),
            ("KD_ADMIN_LISTEN", format!("127.0.0.1:{lb_admin}")),
            ("KD_NAMESPACE", self.namespace.to_owned()),
            ("KD_LOG_JSON", "1".to_owned()),
            ("KD_INSECURE", SECURITY_OFF.to_owned()),
            ("KD_ALLOW_ANONYMOUS", SECURITY_OFF.to_owned()),
        ];
        tier.push(Component::spawn(
            "loadbalancer",
            &self.binaries.loadbalancer,
            &[],
            &env,
            log_dir,
            None,
        )?);

        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        let mut ticks = tokio::time::interval(Duration::from_millis(50));
        loop {
            ticks.tick().await;
            let mut ready = load_balancer_ready(lb_admin, ids.len()).await;
            for admin in &dispatcher_admin {
                ready = ready && dispatcher_ready(*admin, ids.len()).await;
            }
            if ready {
                return Ok(Tier {
                    components: tier,
                    lb_port,
                    dispatcher_admin,
                });
            }
            for c in &mut tier {
                c.ensure_running()?;
            }
            if tokio::time::Instant::now() > deadline {
                anyhow::bail!(
                    "the dispatchers and the load balancer were not ready within 60 s; logs in {}",
                    log_dir.display()
                );
            }
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

/// The figures the admin endpoint at `admin` shows now, if it answers within a second.
async fn admin_figures(admin: u16) -> Option<String> {
    let scraped = tokio::time::timeout(
        Duration::from_secs(1),
        scrape(([127, 0, 0, 1], admin).into()),
    );
    let body = scraped.await.ok()?.ok()?;
    Some(String::from_utf8_lossy(&body).into_owned())
}

/// The dispatcher on `admin` sees a ring of `members` and serves every key it owns on it: its
/// figures say so (both from one scrape), and then its `/readyz` (asked after them, so a ring
/// adopted in between shows as a handover pending).
async fn dispatcher_ready(admin: u16, members: usize) -> bool {
    let Some(figures) = admin_figures(admin).await else {
        return false;
    };
    counter_sum(&figures, "kube_dispatch_ring_members") == members as f64
        && counter_sum(&figures, "kube_dispatch_ring_serving") == 1.0
        && http_status(
            ([127, 0, 0, 1], admin).into(),
            "/readyz",
            Duration::from_secs(1),
        )
        .await
            == Some(200)
}

/// The load balancer on `admin` leads and knows all `members` dispatchers.
async fn load_balancer_ready(admin: u16, members: usize) -> bool {
    admin_figures(admin).await.is_some_and(|figures| {
        counter_sum(&figures, "kube_dispatch_lb_leader") == 1.0
            && counter_sum(&figures, "kube_dispatch_lb_dispatchers") == members as f64
    })
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

/// `n` distinct free loopback ports: all held open until all are picked.
fn free_ports(n: usize) -> anyhow::Result<Vec<u16>> {
    let listeners = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").context("no free loopback port"))
        .collect::<anyhow::Result<Vec<_>>>()?;
    listeners
        .iter()
        .map(|l| Ok(l.local_addr()?.port()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two groups over two kinds: each follows the writes to its own kind.
    fn mixed(starts: [Vec<(u64, u64)>; 2]) -> Observations {
        let [config_maps, records] = starts;
        Observations {
            written: vec![
                [("ns/obj-000000".to_owned(), config_maps)].into(),
                [("ns/obj-000001".to_owned(), records)].into(),
            ],
            ..Observations::default()
        }
    }

    #[test]
    fn a_variant_reads_back_as_it_prints_and_names_its_list_mode() {
        for name in [
            "kube-rs",
            "controller-runtime",
            "dispatch-1",
            "dispatch-paged-1",
            "dispatch-stream-4",
            "dispatch-list-2",
            "go-dispatch-1",
        ] {
            let variant: Variant = name.parse().unwrap();
            assert_eq!(variant.to_string(), name);
        }
        let paged: Variant = "dispatch-paged-1".parse().unwrap();
        assert_eq!(paged.list_mode(), Some(ListMode::Paged));
        assert!(paged.on_tier() && paged.is_sdk_alone());
        assert_eq!("dispatch-1".parse::<Variant>().unwrap().list_mode(), None);
        assert!(
            !"dispatch-stream-2"
                .parse::<Variant>()
                .unwrap()
                .is_sdk_alone()
        );
        assert!("dispatch-paged-0".parse::<Variant>().is_err());
        assert!("dispatch-chunked-1".parse::<Variant>().is_err());
    }

    #[test]
    fn a_write_waits_only_for_the_groups_of_its_kind() {
        // The ConfigMap group saw the write (rv 7) at 30; the Record group never reconciled
        // the Record written.
        let o = mixed([vec![(10, 5), (30, 7), (40, 8)], Vec::new()]);
        assert_eq!(
            o.reconciled_after("ns/obj-000000", Write::Object(7)),
            Some(30)
        );
        assert_eq!(o.reconciled_after("ns/obj-000001", Write::Object(7)), None);
        // A reconcile of an older version does not count.
        assert_eq!(o.reconciled_after("ns/obj-000000", Write::Object(9)), None);
        // A key no group follows is never reconciled.
        assert_eq!(o.reconciled_after("ns/obj-000002", Write::Object(1)), None);
    }

    #[test]
    fn a_write_waits_for_the_last_group_of_its_kind() {
        let o = Observations {
            written: vec![
                [("ns/a".to_owned(), vec![(20, 3)])].into(),
                [("ns/a".to_owned(), vec![(50, 3)])].into(),
                [("ns/b".to_owned(), vec![(5, 1)])].into(),
            ],
            ..Observations::default()
        };
        assert_eq!(o.reconciled_after("ns/a", Write::Object(3)), Some(50));
        assert_eq!(o.reconciled_after("ns/b", Write::Object(1)), Some(5));
    }

    /// A child's write is reconciled by the owner's first reconcile that starts after it,
    /// whatever version of the owner that reconcile saw.
    #[test]
    fn a_childs_write_waits_for_the_owners_next_reconcile() {
        let o = mixed([vec![(10, 5), (30, 5), (40, 8)], Vec::new()]);
        assert_eq!(
            o.reconciled_after("ns/obj-000000", Write::Child(20)),
            Some(30)
        );
        assert_eq!(o.reconciled_after("ns/obj-000000", Write::Child(41)), None);
    }
}
