//! The processes of a run: the controller replicas of a variant, and the tier (dispatchers and
//! load balancer) they connect to, each started and awaited until it says it is ready.

use std::{path::Path, time::Duration};

use anyhow::Context as _;
use k8s_openapi::api::coordination::v1::Lease;
use kube::{
    Api,
    api::{DeleteParams, ListParams},
};
use kube_dispatch_bench::ReconcileStart;
use tokio::sync::mpsc;

use super::{
    ListMode, SECURITY_OFF, Setup, Tier, Variant, group_name,
    ready::{dispatcher_ready, free_ports, load_balancer_ready},
};
use crate::harness::process::Component;

/// A sender of group `group`'s reconcile lines, which reach `tx` tagged with the group.
pub(super) fn group_channel(
    group: usize,
    tx: &mpsc::Sender<(usize, ReconcileStart)>,
) -> mpsc::Sender<ReconcileStart> {
    let (group_tx, mut group_rx) = mpsc::channel::<ReconcileStart>(1024);
    let tx = tx.clone();
    tokio::spawn(async move {
        while let Some(start) = group_rx.recv().await {
            if tx.send((group, start)).await.is_err() {
                break;
            }
        }
    });
    group_tx
}

impl Setup<'_> {
    /// Starts each controller group's replicas of `variant` (connected to the load balancer on
    /// `lb_port` when on the tier), each reconcile they print sent on `tx` tagged with the group.
    pub(crate) fn start_replicas(
        &self,
        variant: Variant,
        lb_port: u16,
        log_dir: &Path,
        tx: &mpsc::Sender<(usize, ReconcileStart)>,
    ) -> anyhow::Result<Vec<Component>> {
        let (program, count, args) = self.replica_command(variant)?;
        let mut replicas = Vec::new();
        for group in 0..self.groups {
            let group_tx = group_channel(group, tx);
            let args = [
                ["--kind", self.group_kind(group).flag()]
                    .map(str::to_owned)
                    .as_slice(),
                &args,
            ]
            .concat();
            for i in 0..count {
                replicas.push(self.spawn_replica(
                    (group, i),
                    (program, &args),
                    lb_port,
                    log_dir,
                    &group_tx,
                )?);
            }
        }
        Ok(replicas)
    }

    /// Starts replica `i` of controller group `group`: `program` with `args` (with `--kind`
    /// already), connected to the load balancer on `lb_port` when on the tier, its reconcile
    /// lines sent on `group_tx`.
    pub(super) fn spawn_replica(
        &self,
        (group, i): (usize, usize),
        (program, args): (&Path, &[String]),
        lb_port: u16,
        log_dir: &Path,
        group_tx: &mpsc::Sender<ReconcileStart>,
    ) -> anyhow::Result<Component> {
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
        Component::spawn(&name, program, args, &env, log_dir, Some(group_tx.clone()))
    }

    /// The program, the replicas per group and the arguments of `variant`'s replicas.
    pub(super) fn replica_command(
        &self,
        variant: Variant,
    ) -> anyhow::Result<(&Path, usize, Vec<String>)> {
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
            Variant::ControllerRuntime
            | Variant::ControllerRuntimeMetadata
            | Variant::ControllerRuntimeIndex => {
                if variant == Variant::ControllerRuntimeMetadata {
                    args.push("--metadata".to_owned());
                }
                let program = self.binaries.controller_runtime.as_ref().context(
                    "the controller-runtime variants need --controller-runtime (bench/controller-runtime/build.sh builds it)",
                )?;
                (program, 1)
            }
            Variant::GoDispatch(n) | Variant::GoDispatchIndex(n) => {
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
            | Variant::DispatchListing(..)
            | Variant::DispatchIndex(_) => {
                let (runtime, count) = match variant {
                    Variant::KubeRsMetadata => ("kube-rs-metadata", 1),
                    Variant::KubeRsStreaming => ("kube-rs-streaming", 1),
                    Variant::Dispatch(n)
                    | Variant::DispatchList(n)
                    | Variant::DispatchListing(_, n)
                    | Variant::DispatchIndex(n) => ("dispatch", n),
                    _ => ("kube-rs", 1),
                };
                args.extend(["--runtime".to_owned(), runtime.to_owned()]);
                if self.children > 0 {
                    let from = match variant {
                        Variant::DispatchList(_) => "list",
                        Variant::DispatchIndex(_) => "index",
                        _ => "request",
                    };
                    args.extend(["--children-from".to_owned(), from.to_owned()]);
                }
                (&self.binaries.controller, count)
            }
        };
        if self.children > 0 {
            args.extend(["--children".to_owned(), self.children.to_string()]);
            if variant.by_index() && !matches!(variant, Variant::DispatchIndex(_)) {
                args.extend(["--children-from".to_owned(), "index".to_owned()]);
            }
        }
        Ok((program, count, args))
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
        crate::harness::apiserver::retried(|| async {
            leases
                .delete_collection(&DeleteParams::default(), &ListParams::default())
                .await?;
            Ok(())
        })
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
        let mut dispatcher_env = Vec::new();
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
            env.push((
                "KD_SHARE_LISTS",
                list_mode.is_none_or(ListMode::shared).to_string(),
            ));
            env.push((
                "KD_PROTOBUF",
                list_mode.is_none_or(ListMode::protobuf).to_string(),
            ));
            tier.push(Component::spawn(
                id,
                &self.binaries.dispatcher,
                &[],
                &env,
                log_dir,
                None,
            )?);
            dispatcher_env.push(env);
        }
        let (lb_port, lb_admin) = (next_port()?, next_port()?);
        tier.push(self.loadbalancer("loadbalancer", (lb_port, lb_admin), log_dir)?);

        let ready = async || {
            load_balancer_ready(lb_admin, ids.len()).await
                && dispatchers_ready(&dispatcher_admin).await
        };
        until_ready(&mut tier, Duration::from_secs(60), ready)
            .await
            .with_context(|| {
                format!(
                    "waiting for the dispatchers and the load balancer (logs in {})",
                    log_dir.display()
                )
            })?;
        Ok(Tier {
            components: tier,
            lb_port,
            dispatcher_admin,
            dispatcher_env,
        })
    }
}

/// Waits until `ready` says so, asking every 50 ms, failing if one of `components` exits
/// meanwhile or `bound` passes first.
pub(super) async fn until_ready(
    components: &mut [Component],
    bound: Duration,
    ready: impl AsyncFn() -> bool,
) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + bound;
    let mut ticks = tokio::time::interval(Duration::from_millis(50));
    loop {
        ticks.tick().await;
        if ready().await {
            return Ok(());
        }
        for c in components.iter_mut() {
            c.ensure_running()?;
        }
        anyhow::ensure!(
            tokio::time::Instant::now() <= deadline,
            "not ready within {bound:?}"
        );
    }
}

impl Setup<'_> {
    /// Starts a load balancer named `name`, serving on `port` and its admin endpoint on
    /// `admin`.
    pub(super) fn loadbalancer(
        &self,
        name: &str,
        (port, admin): (u16, u16),
        log_dir: &Path,
    ) -> anyhow::Result<Component> {
        let env = [
            ("KUBECONFIG", self.kubeconfig.display().to_string()),
            ("KD_LISTEN", format!("127.0.0.1:{port}")),
            ("KD_ADMIN_LISTEN", format!("127.0.0.1:{admin}")),
            ("KD_NAMESPACE", self.namespace.to_owned()),
            ("KD_LOG_JSON", "1".to_owned()),
            ("KD_INSECURE", SECURITY_OFF.to_owned()),
            ("KD_ALLOW_ANONYMOUS", SECURITY_OFF.to_owned()),
        ];
        Component::spawn(name, &self.binaries.loadbalancer, &[], &env, log_dir, None)
    }
}

/// Every dispatcher whose admin port is in `admins` is ready on a ring of them all.
pub(super) async fn dispatchers_ready(admins: &[u16]) -> bool {
    for admin in admins {
        if !dispatcher_ready(*admin, admins.len()).await {
            return false;
        }
    }
    true
}
