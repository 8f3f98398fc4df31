//! One run: one variant of the controller on one scenario's objects (in one namespace, or
//! spread over many; of one kind, or of several with the controllers spread over them), from
//! start to stop.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::Context as _;
use kube::Client;
use kube_dispatch_bench::now_micros;

use super::{
    apiserver::{ControlPlane, RequestCounts, request_counts},
    objects::{self, Kind, object_name},
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
    /// Each dispatcher's environment, to start it again as it was.
    pub(crate) dispatcher_env: Vec<Vec<(&'static str, String)>>,
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
    /// The part of `apiserver_cpu` spent from then until every timed write's reconcile had
    /// started: the writes, the watch events they made and the controllers' own requests. The
    /// rest (but `check`) is stopping every process, and waiting for the API server to count
    /// their watches as ended.
    pub(crate) apiserver_cpu_writes: f64,
    pub(crate) etcd_cpu: f64,
    /// Reconciles started, in all.
    pub(crate) reconciles: u64,
    /// What the harness's own check that every child was repaired cost the API server (with
    /// `children`): its LIST requests and the API server's CPU meanwhile, taken out of the
    /// figures above.
    pub(crate) check: (u64, f64),
}

pub(crate) const VERBS: [&str; 5] = ["LIST", "WATCH", "GET", "PATCH", "APPLY"];
pub(crate) mod daily;
mod measure;
mod processes;
mod ready;
mod variant;

pub(crate) use variant::{ListMode, Variant};

impl Setup<'_> {
    /// The kind controller group `group` reconciles.
    pub(crate) fn group_kind(&self, group: usize) -> Kind {
        self.kinds[group % self.kinds.len()]
    }

    /// The resources of the scenario's objects: its kinds', and ConfigMaps for their children.
    fn resources(&self) -> Vec<&'static str> {
        let mut resources: Vec<&str> = self.kinds.iter().map(|k| k.resource()).collect();
        if self.children > 0 {
            resources.push(Kind::ConfigMap.resource());
        }
        resources.sort_unstable();
        resources.dedup();
        resources
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
        let (tx, observed, observer) = self.observe(&written);

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
        for verb in VERBS {
            let mut n: u64 = self
                .resources()
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
