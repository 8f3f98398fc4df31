//! `kube-dispatch-bench`: runs the same controller as a kube-rs `Controller` and on
//! kube-dispatch, on the same objects of a real API server, and prints what each used. Each
//! benchmark is a subcommand (`compare`, `security`, `hostile`, `metrics`, `ceiling`,
//! `shards`, `daily`); run them through `make bench` and the `make bench-*` targets, which build the
//! binaries they start as kube-dispatch ships them (cargo's `dist` profile) and the control
//! plane.

mod cli;
mod compare;
mod harness;
mod markdown;

use std::{
    path::Path,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use clap::Parser;
use cli::{Bench, CeilingArgs, Cli, DailyArgs, HostileArgs, MetricsArgs, SecurityArgs, ShardsArgs};
use harness::{
    apiserver::ControlPlane,
    objects::{Kind, populate},
    run::{Binaries, Setup},
};
use kube_dispatch_bench::now_micros;
use kube_dispatch_tests::Cluster;
use markdown::own_dir;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    match Cli::parse().bench {
        Bench::Compare(args) => compare::compare(*args).await,
        Bench::Security(args) => security(args).await,
        Bench::Hostile(args) => hostile(args).await,
        Bench::Metrics(args) => metrics(args).await,
        Bench::Ceiling(args) => ceiling(args).await,
        Bench::Shards(args) => shards(args).await,
        Bench::Daily(args) => daily(args).await,
    }
}

/// The local control plane the benchmarks that start processes run against.
struct Plane {
    client: kube::Client,
    kubeconfig: &'static Path,
    control_plane: ControlPlane,
    /// The workspace, whose `Cargo.lock` and control-plane state it reads.
    root: &'static Path,
}

impl Plane {
    /// Connects to the shared control plane (starting it if it is not running).
    async fn connect() -> anyhow::Result<Self> {
        let cluster = Cluster::shared();
        let client = cluster.client().await?;
        let root = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .context("the bench crate has no parent directory")?;
        let control_plane = ControlPlane::from_state(root)?;
        Ok(Self {
            client,
            kubeconfig: cluster.kubeconfig(),
            control_plane,
            root,
        })
    }

    /// `objects` ConfigMaps of `object_bytes` bytes in a namespace of their own, filled once
    /// (later runs reuse it): the namespace.
    async fn config_maps(&self, objects: usize, object_bytes: usize) -> anyhow::Result<String> {
        let kind = Kind::ConfigMap;
        let namespace = objects_namespace(kind.flag(), objects, object_bytes);
        populate(&self.client, kind, &namespace, objects, object_bytes).await?;
        Ok(namespace)
    }

    /// `objects` Records of `object_bytes` bytes, each owning `children` ConfigMaps as the
    /// controller keeps them, in a namespace of their own, filled once (the same as
    /// `compare --children`'s): the namespace.
    async fn owners(
        &self,
        objects: usize,
        object_bytes: usize,
        children: usize,
    ) -> anyhow::Result<String> {
        harness::objects::install_crd(&self.client).await?;
        let namespace = harness::objects::owners_namespace(Kind::Record.flag(), objects, children);
        populate(
            &self.client,
            Kind::Record,
            &namespace,
            objects,
            object_bytes,
        )
        .await?;
        harness::objects::populate_children(&self.client, &namespace, objects, children).await?;
        Ok(namespace)
    }

    /// A run over the `objects` ConfigMaps of `namespace` with one controller, one
    /// dispatcher, no timed writes of the compare benchmark's and security off: what the
    /// benchmarks of one namespace change from.
    fn config_map_setup<'a>(
        &'a self,
        binaries: &'a Binaries,
        namespace: &'a str,
        objects: usize,
        log_dir: &'a Path,
    ) -> Setup<'a> {
        Setup {
            client: &self.client,
            kubeconfig: self.kubeconfig,
            binaries,
            control_plane: self.control_plane,
            kinds: &[Kind::ConfigMap],
            namespace,
            objects,
            namespaces: 1,
            groups: 1,
            dispatchers: 1,
            writes: 0,
            write_interval: Duration::ZERO,
            log_dir,
            ring_key: None,
            nonce: now_micros(),
            children: 0,
            profile_apiserver: false,
        }
    }
}

/// Each object's data unless `--object-bytes` says otherwise.
const OBJECT_BYTES: usize = 2048;

/// The namespace that holds `objects` objects of the kinds `flags` names, in one namespace: a
/// size other than [`OBJECT_BYTES`] gets one of its own (`-300b`), so that a run at one size
/// does not rewrite every object another size's runs left.
fn objects_namespace(flags: &str, objects: usize, object_bytes: usize) -> String {
    if object_bytes == OBJECT_BYTES {
        format!("kd-bench-{flags}-{objects}")
    } else {
        format!("kd-bench-{flags}-{objects}-{object_bytes}b")
    }
}

/// `ceiling`: the watch events one dispatcher absorbs per core, written into the `ceiling`
/// section.
async fn ceiling(args: CeilingArgs) -> anyhow::Result<()> {
    let binaries = args.processes.binaries(None, None)?;
    let plane = Plane::connect().await?;
    let objects = args.objects;
    let namespace = plane.config_maps(objects, args.object_bytes).await?;
    // The ceiling paces its writes by each rate of the plan, not by the setup's.
    let setup = plane.config_map_setup(&binaries, &namespace, objects, &args.processes.logs);
    let steps = setup
        .ceiling(&harness::ceiling::Plan {
            rates: args.rates.clone(),
            window: args.window,
        })
        .await?;
    let table = harness::ceiling::table(&steps);
    args.output.publish(
        ("ceiling", "make bench-ceiling"),
        &format!(
            "{objects} ConfigMaps of {} bytes, one dispatcher, one SDK replica, each rate held {}, at most {} patches in flight, security off",
            args.object_bytes,
            humantime::format_duration(args.window),
            harness::ceiling::WRITERS,
        ),
        &args.processes.bin_dir(),
        &table,
        &harness::ceiling::Figures { steps: &steps },
    )
}

/// `shards`: the ring keyed by namespace with server-side sharding against the ring keyed by
/// name, written into the `shards` section.
async fn shards(args: ShardsArgs) -> anyhow::Result<()> {
    use harness::shards;
    let binaries = args.processes.binaries(None, None)?;
    let plane = Plane::connect().await?;
    let nonce = now_micros();
    let (objects, namespaces) = (args.objects, args.namespaces);
    let begun = Instant::now();
    let (lease_namespace, written) = harness::objects::populate_spread(
        &plane.client,
        Kind::ConfigMap,
        harness::objects::Spread::new(namespaces * objects, namespaces, 0),
        args.object_bytes,
    )
    .await?;
    println!(
        "bench-shards: {namespaces} namespaces of {objects} ConfigMaps: {written} written in {:.1} s",
        begun.elapsed().as_secs_f64()
    );
    let mut outcomes = Vec::new();
    for variant in [
        shards::Variant::KubeRs,
        shards::Variant::Tier("name"),
        shards::Variant::Tier("namespace"),
    ] {
        let ring_key = match variant {
            shards::Variant::Tier(key) => Some(key),
            shards::Variant::KubeRs => None,
        };
        let setup = Setup {
            client: &plane.client,
            kubeconfig: plane.kubeconfig,
            binaries: &binaries,
            control_plane: plane.control_plane,
            kinds: &[Kind::ConfigMap],
            namespace: &lease_namespace,
            objects: namespaces * objects,
            namespaces,
            groups: 1,
            dispatchers: usize::from(args.dispatchers),
            writes: args.writes,
            write_interval: args.write_interval,
            log_dir: &args.processes.logs,
            ring_key,
            nonce,
            children: 0,
            profile_apiserver: false,
        };
        outcomes.push(
            setup
                .shards(variant)
                .await
                .with_context(|| format!("{variant}"))?,
        );
    }
    let table = shards::table(&outcomes);
    args.output.publish(
        ("shards", "make bench-shards"),
        &format!(
            "{namespaces} namespaces of {objects} ConfigMaps of {} bytes, {} dispatchers, one SDK replica over every namespace; {} writes {} apart; security off",
            args.object_bytes,
            args.dispatchers,
            args.writes,
            humantime::format_duration(args.write_interval),
        ),
        &args.processes.bin_dir(),
        &table,
        &shards::Figures {
            outcomes: &outcomes,
        },
    )
}

/// `security`: the cost of TLS and reviews, written into the `security` section.
async fn security(args: SecurityArgs) -> anyhow::Result<()> {
    let results = harness::security::run(harness::security::Plan {
        repeats: args.repeats,
        writes: args.writes,
        opens: args.opens,
        sessions: args.sessions,
        identities: args.identities,
        window: args.window,
    })
    .await?;
    let table = results.table();
    args.output.publish(
        ("security", "make bench-security"),
        &format!(
            "one dispatcher in the benchmark's process; {} timed writes and {} OpenSessions per run",
            args.writes, args.opens,
        ),
        &own_dir(),
        &table,
        &results.figures(),
    )
}

/// `hostile`: what each attack costs a legitimate controller, written into the `hostile`
/// section.
async fn hostile(args: HostileArgs) -> anyhow::Result<()> {
    let results = harness::hostile::run(harness::hostile::Plan {
        repeats: args.repeats,
        writes: args.writes,
        attacks: harness::hostile::Attack::chosen(&args.attacks),
        dispatcher: args.processes.bin_dir().join("kube-dispatch-dispatcher"),
        logs: args.processes.logs.join("hostile"),
    })
    .await?;
    let table = results.table();
    args.output.publish(
        ("hostile", "make bench-hostile"),
        "one dispatcher process, TLS and token reviews on, every bound at its default but the body pool; a legitimate controller in the benchmark's process; the attackers beside it on threads of their own, all on loopback",
        &args.processes.bin_dir(),
        &table,
        &results,
    )
}

/// `metrics`: what metrics cost a reconcile, written into the `metrics` section.
async fn metrics(args: MetricsArgs) -> anyhow::Result<()> {
    let results = harness::metrics::run(harness::metrics::Plan {
        repeats: args.repeats,
        objects: args.objects,
    })
    .await?;
    let table = results.table();
    args.output.publish(
        ("metrics", "make bench-metrics"),
        "one dispatcher and one controller replica in the benchmark's process, security off, a reconcile that does nothing",
        &own_dir(),
        &table,
        &results,
    )
}

/// `daily`: a controller's rollout and the tier's rolling upgrade, each controller in its
/// production shape, written into the `daily` section.
async fn daily(args: DailyArgs) -> anyhow::Result<()> {
    use harness::run::daily::{self, Shape};
    let needs_go = args.shapes.iter().any(|s| s.is_controller_runtime());
    anyhow::ensure!(
        !needs_go || args.controller_runtime.is_some(),
        "the controller-runtime shapes need --controller-runtime (bench/controller-runtime/build.sh builds it)"
    );
    let binaries = args
        .processes
        .binaries(args.controller_runtime.clone(), None)?;
    let plane = Plane::connect().await?;
    let namespace = if args.children > 0 {
        plane
            .owners(args.objects, args.object_bytes, args.children)
            .await?
    } else {
        plane.config_maps(args.objects, args.object_bytes).await?
    };
    let setup = Setup {
        dispatchers: usize::from(args.dispatchers),
        writes: args.writes,
        write_interval: args.write_interval,
        kinds: if args.children > 0 {
            &[Kind::Record]
        } else {
            &[Kind::ConfigMap]
        },
        children: args.children,
        ..plane.config_map_setup(&binaries, &namespace, args.objects, &args.processes.logs)
    };
    let mut runs = Vec::new();
    // Each shape once, in the order given: a shape run twice in one repeat would write the
    // same values again.
    let mut shapes: Vec<Shape> = Vec::new();
    for shape in &args.shapes {
        if !shapes.contains(shape) {
            shapes.push(*shape);
        }
    }
    for run in 0..args.repeats {
        for shape in &shapes {
            println!("bench-daily: run {} of {}: {shape}", run + 1, args.repeats);
            runs.extend(setup.daily(*shape, run).await?);
        }
        shapes.rotate_left(1);
    }
    let table = daily::table(&runs);
    // With children, a page of its own: the ConfigMaps' section stays as it was.
    let section = if args.children > 0 {
        "daily-owners"
    } else {
        "daily"
    };
    args.output.publish(
        (section, "make bench-daily"),
        &format!(
            "{} {} of {} bytes{}; {} dispatchers; two replicas of every controller; {} objects written in turn every {}{}; security off",
            args.objects,
            if args.children > 0 { "Records" } else { "ConfigMaps" },
            args.object_bytes,
            if args.children > 0 {
                format!(" owning {} ConfigMaps each", args.children)
            } else {
                String::new()
            },
            args.dispatchers,
            args.writes,
            humantime::format_duration(args.write_interval),
            if args.children > 0 {
                " (an owner, then a child)"
            } else {
                ""
            },
        ),
        &args.processes.bin_dir(),
        &table,
        &daily::Figures { runs: &runs },
    )
}
