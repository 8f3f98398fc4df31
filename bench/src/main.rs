//! `kube-dispatch-bench`: runs the same controller as a kube-rs `Controller` and on
//! kube-dispatch, on the same objects of a real API server, and prints what each used. Each
//! benchmark is a subcommand (`compare`, `security`, `hostile`, `metrics`, `ceiling`,
//! `shards`); run them through `make bench` and the `make bench-*` targets, which build the
//! binaries they start as kube-dispatch ships them (cargo's `dist` profile) and the control
//! plane.

mod cli;
mod harness;
mod markdown;

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::Context as _;
use clap::Parser;
use cli::{
    Bench, CeilingArgs, Cli, CompareArgs, HostileArgs, MetricsArgs, SecurityArgs, ShardsArgs,
};
use harness::{
    apiserver::ControlPlane,
    objects::{self, Kind, install_crd, populate},
    plot,
    report::{self, Axis, Scenario, rows, series},
    run::{Setup, Variant},
};
use kube_dispatch_bench::now_micros;
use kube_dispatch_tests::Cluster;
use markdown::{own_dir, produced, results_section};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    match Cli::parse().bench {
        Bench::Compare(args) => compare(*args).await,
        Bench::Security(args) => security(args).await,
        Bench::Hostile(args) => hostile(args).await,
        Bench::Metrics(args) => metrics(args).await,
        Bench::Ceiling(args) => ceiling(args).await,
        Bench::Shards(args) => shards(args).await,
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

/// `compare`: every variant on every scenario, written into the section --section.
async fn compare(args: CompareArgs) -> anyhow::Result<()> {
    args.check()?;
    let binaries = args.processes.binaries(
        args.controller_runtime.clone(),
        args.controller_runtime_dispatch.clone(),
    )?;
    let plane = Plane::connect().await?;
    let client = &plane.client;
    if args.kinds.contains(&Kind::Record) {
        install_crd(client).await?;
    }
    let nonce = now_micros();
    let namespaces = args.namespaces;

    let mut scenarios = Vec::new();
    for kinds in kind_sets(&args) {
        for &objects in &args.objects {
            let begun = Instant::now();
            // In one namespace, every kind's objects share it; spread over many, the tier's
            // Leases go beside the first kind's.
            let mut namespace = if args.children > 0 && namespaces == 1 {
                format!(
                    "kd-bench-{}-{objects}-owning-{}",
                    objects::flags(&kinds),
                    args.children
                )
            } else if namespaces == 1 {
                objects_namespace(&objects::flags(&kinds), objects, args.object_bytes)
            } else {
                String::new()
            };
            let mut written = 0;
            for &kind in &kinds {
                if namespaces == 1 {
                    written +=
                        populate(client, kind, &namespace, objects, args.object_bytes).await?;
                } else {
                    let spread = objects::Spread::new(objects, namespaces, args.children);
                    let (leases, n) =
                        objects::populate_spread(client, kind, spread, args.object_bytes).await?;
                    if namespace.is_empty() {
                        namespace = leases;
                    }
                    written += n;
                }
            }
            if args.children > 0 && namespaces == 1 {
                written +=
                    objects::populate_children(client, &namespace, objects, args.children).await?;
            } else if args.children > 0 {
                let spread = objects::Spread::new(objects, namespaces, args.children);
                for i in 0..namespaces {
                    written += objects::populate_children(
                        client,
                        &spread.namespace(i),
                        spread.per,
                        args.children,
                    )
                    .await?;
                }
            }
            println!(
                "bench: {objects} {} in {}: {written} written in {:.1} s",
                objects::titles(&kinds),
                if namespaces == 1 {
                    namespace.clone()
                } else {
                    format!("{namespaces} namespaces")
                },
                begun.elapsed().as_secs_f64()
            );
            for &groups in &args.groups {
                let setup = Setup {
                    client,
                    kubeconfig: plane.kubeconfig,
                    binaries: &binaries,
                    control_plane: plane.control_plane,
                    kinds: &kinds,
                    namespace: &namespace,
                    objects,
                    namespaces,
                    groups,
                    dispatchers: usize::from(args.dispatchers),
                    writes: args.writes,
                    write_interval: args.write_interval,
                    log_dir: &args.processes.logs,
                    ring_key: args.ring_key.as_deref(),
                    nonce,
                    children: args.children,
                    profile_apiserver: args.profile_apiserver,
                };
                let mut runs = Vec::new();
                for repeat in 0..args.repeats {
                    let mut order = args.variants.clone();
                    let turn = repeat % order.len();
                    order.rotate_left(turn);
                    for variant in order {
                        let result = setup.run(variant, repeat).await.with_context(|| {
                            format!("{namespace}: {variant}, run {}", repeat + 1)
                        })?;
                        println!(
                            "bench: {namespace} {variant:<17} run {}: first reconcile {:>7.0} ms, all {:>7.0} ms, replica peak {:>6.1} MiB",
                            repeat + 1,
                            result.first_reconcile.as_secs_f64() * 1e3,
                            result.all_reconciled.as_secs_f64() * 1e3,
                            result
                                .replicas
                                .iter()
                                .map(|u| u.peak_rss)
                                .max()
                                .unwrap_or(0) as f64
                                / 1024.0
                                / 1024.0,
                        );
                        runs.push(result);
                    }
                }
                let scenario = Scenario {
                    kinds: kinds.clone(),
                    objects,
                    namespaces,
                    groups,
                    children: args.children,
                    runs,
                };
                println!("\n{}", scenario.table());
                scenarios.push(scenario);
            }
        }
    }

    let plots = draw_plots(&args, &scenarios);
    let section = results_section(&args, plane.root, &scenarios, &plots)?;
    args.output
        .write(&args.section, &section, &report::Figures::of(&scenarios))
}

/// `ceiling`: the watch events one dispatcher absorbs per core, written into the `ceiling`
/// section.
async fn ceiling(args: CeilingArgs) -> anyhow::Result<()> {
    let binaries = args.processes.binaries(None, None)?;
    let plane = Plane::connect().await?;
    let nonce = now_micros();
    let objects = args.objects;
    let kind = Kind::ConfigMap;
    let namespace = objects_namespace(kind.flag(), objects, args.object_bytes);
    populate(&plane.client, kind, &namespace, objects, args.object_bytes).await?;
    let setup = Setup {
        client: &plane.client,
        kubeconfig: plane.kubeconfig,
        binaries: &binaries,
        control_plane: plane.control_plane,
        kinds: &[kind],
        namespace: &namespace,
        objects,
        namespaces: 1,
        groups: 1,
        dispatchers: 1,
        writes: 0,
        // Not used: the ceiling paces its writes by each rate of the plan.
        write_interval: Duration::ZERO,
        log_dir: &args.processes.logs,
        ring_key: None,
        nonce,
        children: 0,
        profile_apiserver: false,
    };
    let steps = setup
        .ceiling(&harness::ceiling::Plan {
            rates: args.rates.clone(),
            window: args.window,
        })
        .await?;
    let table = harness::ceiling::table(&steps);
    println!("\n{table}");
    let section = produced(
        args.output.command("make bench-ceiling"),
        &format!(
            "{objects} ConfigMaps of {} bytes, one dispatcher, one SDK replica, each rate held {}, at most {} patches in flight, security off",
            args.object_bytes,
            humantime::format_duration(args.window),
            harness::ceiling::WRITERS,
        ),
        &args.processes.bin_dir(),
        &table,
    );
    args.output.write(
        "ceiling",
        &section,
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
    println!("\n{table}");
    let section = produced(
        args.output.command("make bench-shards"),
        &format!(
            "{namespaces} namespaces of {objects} ConfigMaps of {} bytes, {} dispatchers, one SDK replica over every namespace; {} writes {} apart; security off",
            args.object_bytes,
            args.dispatchers,
            args.writes,
            humantime::format_duration(args.write_interval),
        ),
        &args.processes.bin_dir(),
        &table,
    );
    args.output.write(
        "shards",
        &section,
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
    println!("\n{table}");
    let section = produced(
        args.output.command("make bench-security"),
        &format!(
            "one dispatcher in the benchmark's process; {} timed writes and {} OpenSessions per run",
            args.writes, args.opens,
        ),
        &own_dir(),
        &table,
    );
    args.output.write("security", &section, &results.figures())
}

/// `hostile`: what each attack costs a legitimate controller, written into the `hostile`
/// section.
async fn hostile(args: HostileArgs) -> anyhow::Result<()> {
    let results = harness::hostile::run(harness::hostile::Plan {
        repeats: args.repeats,
        writes: args.writes,
        dispatcher: args.processes.bin_dir().join("kube-dispatch-dispatcher"),
        logs: args.processes.logs.join("hostile"),
    })
    .await?;
    let table = results.table();
    println!("\n{table}");
    let section = produced(
        args.output.command("make bench-hostile"),
        "one dispatcher process, TLS and token reviews on, every bound at its default but the body pool; a legitimate controller in the benchmark's process; the attackers beside it, all on loopback",
        &args.processes.bin_dir(),
        &table,
    );
    args.output.write("hostile", &section, &results)
}

/// `metrics`: what metrics cost a reconcile, written into the `metrics` section.
async fn metrics(args: MetricsArgs) -> anyhow::Result<()> {
    let results = harness::metrics::run(harness::metrics::Plan {
        repeats: args.repeats,
        objects: args.objects,
    })
    .await?;
    let table = results.table();
    println!("\n{table}");
    let section = produced(
        args.output.command("make bench-metrics"),
        "one dispatcher and one controller replica in the benchmark's process, security off, a reconcile that does nothing",
        &own_dir(),
        &table,
    );
    args.output.write("metrics", &section, &results)
}

/// The kinds of each scenario: all of --kinds together with --mix, else each on its own.
fn kind_sets(args: &CompareArgs) -> Vec<Vec<Kind>> {
    if args.mix {
        vec![args.kinds.clone()]
    } else {
        args.kinds.iter().map(|k| vec![*k]).collect()
    }
}

/// Memory and start-up against object count, per scenario's kinds; the paths drawn.
fn draw_plots(args: &CompareArgs, scenarios: &[Scenario]) -> Vec<(String, PathBuf)> {
    if let Err(e) = plot::register_font(args.font.as_deref()) {
        eprintln!("bench: no plots: {e:#}");
        return Vec::new();
    }
    if let Err(e) = std::fs::create_dir_all(&args.plots_dir) {
        eprintln!(
            "bench: no plots: cannot create {}: {e}",
            args.plots_dir.display()
        );
        return Vec::new();
    }
    let rows = rows();
    let row = |label: &str| rows.iter().find(|r| r.label.starts_with(label));
    let mut drawn = Vec::new();
    let suffix = if args.section == "default" {
        String::new()
    } else {
        format!("-{}", args.section)
    };
    let named = |s: BTreeMap<Variant, Vec<(usize, f64)>>, suffix: &str| {
        s.into_iter()
            .map(|(v, p)| (format!("{v}{suffix}"), p))
            .collect::<BTreeMap<_, _>>()
    };
    let mut draw = |file: String, title: String, x: &str, y: &str, data| {
        let path = args.plots_dir.join(file);
        // Nothing to draw (one count of objects with several controllers, say): no file, and
        // so no link to one.
        match plot::draw(&path, &title, x, y, &data) {
            Ok(true) => drawn.push((title, path)),
            Ok(false) => {}
            Err(e) => eprintln!("bench: cannot draw {}: {e:#}", path.display()),
        }
    };
    for kinds in kind_sets(args) {
        let kinds = kinds.as_slice();
        let axis = Axis::Objects;
        let mut memory = BTreeMap::new();
        if let Some(r) = row("controller RSS, peak") {
            memory.extend(named(series(scenarios, kinds, axis, r), " replica"));
        }
        if let Some(r) = row("dispatcher RSS, peak") {
            memory.extend(named(
                series(scenarios, kinds, axis, r),
                " dispatcher (each)",
            ));
        }
        let mut startup = BTreeMap::new();
        if let Some(r) = row("start to first reconcile") {
            startup.extend(named(
                series(scenarios, kinds, axis, r),
                ": first reconcile",
            ));
        }
        if let Some(r) = row("start to all objects") {
            startup.extend(named(series(scenarios, kinds, axis, r), ": all reconciled"));
        }
        // Against the object count; with many controllers, only when there are several counts
        // (the plots against the number of controllers below show the rest).
        let by_objects = if args.groups.len() == 1 || args.objects.len() > 1 {
            vec![
                ("memory", "peak RSS per process", "MiB", memory),
                ("startup", "process start to reconciles", "ms", startup),
            ]
        } else {
            Vec::new()
        };
        for (what, title, y, data) in by_objects {
            draw(
                format!("{what}-{}{suffix}.png", objects::flags(kinds)),
                format!("{}: {title}", objects::titles(kinds)),
                "objects",
                y,
                data,
            );
        }
        // Many controllers: what the whole cluster pays, against the number of controllers.
        if args.groups.len() > 1 {
            for &objects in &args.objects {
                let axis = Axis::Groups(objects);
                for (what, label, title, y) in [
                    (
                        "total-memory",
                        "all processes RSS",
                        "RSS of every process",
                        "MiB",
                    ),
                    (
                        "apiserver-cpu",
                        "CPU, kube-apiserver",
                        "kube-apiserver CPU",
                        "s",
                    ),
                    (
                        "all-reconciled",
                        "start to all objects",
                        "start to every object reconciled by every controller",
                        "ms",
                    ),
                ] {
                    let Some(r) = row(label) else { continue };
                    draw(
                        format!("{what}-{}-{objects}{suffix}.png", objects::flags(kinds)),
                        format!("{}, {objects} objects: {title}", objects::titles(kinds)),
                        "controllers",
                        y,
                        named(series(scenarios, kinds, axis, r), ""),
                    );
                }
            }
        }
    }
    drawn
}
