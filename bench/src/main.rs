//! `kube-dispatch-bench`: runs the same controller as a kube-rs `Controller` and on
//! kube-dispatch, on the same objects of a real API server, and prints what each used. Each
//! benchmark is a subcommand (`compare`, `security`, `hostile`, `metrics`, `ceiling`,
//! `shards`); run them through `make bench` and the `make bench-*` targets, which build the
//! binaries they start as kube-dispatch ships them (cargo's `dist` profile) and the control
//! plane.

mod harness;

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    path::{Path, PathBuf},
    time::{Duration, Instant, SystemTime},
};

use anyhow::Context as _;
use clap::{Parser, Subcommand, builder::RangedU64ValueParser};
use harness::{
    apiserver::ControlPlane,
    objects::{self, Kind, install_crd, populate},
    plot,
    report::{self, Axis, Scenario, rows, series},
    run::{Binaries, Setup, Variant},
};
use kube_dispatch_bench::now_micros;
use kube_dispatch_tests::Cluster;
use serde::Serialize;

/// Benchmarks kube-dispatch against the incumbents (a kube-rs `Controller`, and a
/// controller-runtime controller in Go) on a real kube-apiserver and etcd.
///
/// Each subcommand is one benchmark, with a `make` target of its own. Every one runs against
/// the project's local control plane (`tests/cluster/cluster.sh`, started if it is not
/// running), prints its tables, and writes them into one section of `--out`: the lines between
/// `<!-- bench:<section>:begin -->` and `<!-- bench:<section>:end -->`. With `--json` it also
/// writes its figures as JSON, at full precision and under stable keys, for scripts and tests.
/// `kube-dispatch-bench <subcommand> --help` lists each one's settings.
#[derive(Parser, Debug)]
#[command(version)]
struct Cli {
    /// The benchmark to run.
    #[command(subcommand)]
    bench: Bench,
}

/// The benchmarks, one per subcommand.
#[derive(Subcommand, Debug)]
enum Bench {
    /// One controller on kube-dispatch against the incumbents: memory, CPU, start-up,
    /// write-to-reconcile latency and API requests (`make bench`, `make bench-groups`).
    ///
    /// Compares the controller on the SDK with N replicas behind a tier of `--dispatchers`
    /// dispatchers and the load balancer (dispatch-N) against the same controller as a kube-rs
    /// `Controller` with its reflector cache (kube-rs; kube-rs-metadata: a metadata-only cache
    /// and a GET per reconcile) and on controller-runtime in Go (controller-runtime,
    /// controller-runtime-metadata; they need `--controller-runtime`). The process ids of the
    /// control plane give the API server's and etcd's CPU.
    ///
    /// For each kind and object count it fills a namespace (once; later runs reuse it), then
    /// runs each variant of one controller in turn, `--repeats` times, rotating the order. Each
    /// run starts the controller (for dispatch-N: fresh dispatchers, see `--dispatchers`, and
    /// the load balancer first), waits until every object has been reconciled, then makes
    /// `--writes` changes at a steady pace and times each from the write to the reconcile that
    /// sees it. It prints a table per scenario and writes the results into one section of
    /// `--out` (see `--section`), with plots into `--plots-dir`.
    // Boxed: it has many more flags than the others.
    Compare(Box<CompareArgs>),

    /// What TLS, TokenReview and SubjectAccessReview cost (`make bench-security`).
    ///
    /// Compares one dispatcher in the benchmark's process with security off (plaintext,
    /// anonymous) against the same with security on (TLS, ServiceAccount tokens), alternating,
    /// `--repeats` runs each: `--opens` OpenSessions timed, and `--writes` writes timed from the
    /// patch to the poll that delivers it. Then, security on, `--sessions` sessions of
    /// `--identities` ServiceAccounts poll for `--window` while the API server counts the
    /// TokenReviews and SubjectAccessReviews. Written into the `security` section of `--out`.
    Security(SecurityArgs),

    /// What each attack of the threat table costs a legitimate controller
    /// (`make bench-hostile`).
    ///
    /// A dispatcher process with security on and a legitimate controller timing `--writes`
    /// writes from the patch to the poll that hands it over: alone (the baseline), against the
    /// same while each attack runs at its bound (idle admin connections, health streams, junk
    /// tokens, a connection flood, a body hog), `--repeats` times each; with the lost writes,
    /// the `/healthz` answer time and the dispatcher's peak RSS. Written into the `hostile`
    /// section of `--out`.
    Hostile(HostileArgs),

    /// What metrics cost a reconcile: throughput and write-to-reconcile latency
    /// (`make bench-metrics`).
    ///
    /// One dispatcher and one controller in the benchmark's process, with the controller's
    /// metrics off, against the same with metrics on and both processes' `/metrics` scraped
    /// every 100 ms; alternating, `--repeats` runs each, each patching all of `--objects`
    /// ConfigMaps at once. Written into the `metrics` section of `--out`.
    Metrics(MetricsArgs),

    /// The scale ceiling: how many watch events one dispatcher absorbs per CPU-second
    /// (`make bench-ceiling`).
    ///
    /// One dispatcher, the load balancer and one SDK replica on `--objects` ConfigMaps, written
    /// at each of `--rates` for `--window`; per rate, the rate achieved against the target, the
    /// watch events the dispatcher absorbed per CPU-second, each process's CPU, and whether it
    /// kept up (write-to-reconcile latency, and how long after the writer stopped every write
    /// had been reconciled). Written into the `ceiling` section of `--out`.
    Ceiling(CeilingArgs),

    /// Server-side sharding: the ring keyed by namespace against the ring keyed by name and a
    /// kube-rs controller (`make bench-shards`).
    ///
    /// `--namespaces` namespaces of `--objects` labelled ConfigMaps each. A kube-rs controller
    /// over every namespace (the incumbent), then a tier of `--dispatchers` with the ring keyed
    /// by name, then by namespace (each dispatcher asking the API server for its own namespaces
    /// only), each with one SDK replica over every namespace: the cold start, then `--writes`
    /// writes spread over the namespaces, `--write-interval` apart. Per phase and dispatcher:
    /// CPU, objects decoded and how many of them another dispatcher owns; the API server's and
    /// etcd's CPU, its LIST requests and the bytes it sent. Written into the `shards` section
    /// of `--out`.
    Shards(ShardsArgs),
}

/// Where a benchmark writes its results.
#[derive(clap::Args, Debug)]
struct Output {
    /// Markdown file to write the results into, between the benchmark's markers (created if it
    /// does not exist, the section appended if the file lacks it).
    #[arg(long, env = "KD_BENCH_OUT", default_value = "BENCHMARKS.md")]
    out: PathBuf,

    /// How this run was started, as written into --out; default: the benchmark's make target
    /// (`make bench`, `make bench-security`, ...).
    #[arg(long, env = "KD_BENCH_COMMAND")]
    command: Option<String>,

    /// Also write the figures into this JSON file (replaced): those of the tables, at full
    /// precision, each under a stable snake_case key; `null` where a table shows none.
    #[arg(long, env = "KD_BENCH_JSON", value_name = "PATH")]
    json: Option<PathBuf>,
}

impl Output {
    /// --command, or the benchmark's make target.
    fn command<'a>(&'a self, make_target: &'a str) -> &'a str {
        self.command.as_deref().unwrap_or(make_target)
    }

    /// Writes `section` between the markers of `name` in --out, then `figures` into --json if
    /// asked for.
    fn write(&self, name: &str, section: &str, figures: &impl Serialize) -> anyhow::Result<()> {
        write_section(&self.out, name, section)?;
        println!("bench: results written to {}", self.out.display());
        if let Some(path) = &self.json {
            write_json(path, figures)?;
            println!("bench: figures written to {}", path.display());
        }
        Ok(())
    }
}

/// The processes a benchmark starts: where their binaries are, and where they log.
#[derive(clap::Args, Debug)]
struct Processes {
    /// Directory of the binaries: kube-dispatch-dispatcher, kube-dispatch-loadbalancer,
    /// bench-controller [default: the directory of this benchmark's own binary, target/dist
    /// as `make bench` builds it]
    #[arg(long, env = "KD_BENCH_BIN_DIR")]
    bin_dir: Option<PathBuf>,

    /// Where each run's process logs go.
    #[arg(long, env = "KD_BENCH_LOGS", default_value = "target/bench/logs")]
    logs: PathBuf,
}

impl Processes {
    /// --bin-dir, or the directory this benchmark's binary was built into.
    fn bin_dir(&self) -> PathBuf {
        self.bin_dir.clone().unwrap_or_else(own_dir)
    }

    /// The dispatcher, the load balancer and the benchmark controller in --bin-dir, each
    /// checked to exist, with the controller-runtime incumbent if given.
    fn binaries(
        &self,
        controller_runtime: Option<PathBuf>,
        controller_runtime_dispatch: Option<PathBuf>,
    ) -> anyhow::Result<Binaries> {
        let bin_dir = self.bin_dir();
        let binaries = Binaries {
            dispatcher: bin_dir.join("kube-dispatch-dispatcher"),
            loadbalancer: bin_dir.join("kube-dispatch-loadbalancer"),
            controller: bin_dir.join("bench-controller"),
            controller_runtime,
            controller_runtime_dispatch,
        };
        for b in [
            &binaries.dispatcher,
            &binaries.loadbalancer,
            &binaries.controller,
        ] {
            anyhow::ensure!(
                b.exists(),
                "{} is missing: build with `make bench`",
                b.display()
            );
        }
        Ok(binaries)
    }
}

/// A count of one or more.
fn positive() -> RangedU64ValueParser<usize> {
    RangedU64ValueParser::new().range(1..)
}

/// The flags of `compare`.
#[derive(clap::Args, Debug)]
struct CompareArgs {
    /// Object counts, comma-separated.
    #[arg(
        long,
        env = "KD_BENCH_OBJECTS",
        value_delimiter = ',',
        default_value = "1000,10000",
        value_parser = positive()
    )]
    objects: Vec<usize>,

    /// Distinct controllers reconciling every object, comma-separated: each count is a
    /// scenario of its own, with K processes of an incumbent against K controller groups on one
    /// tier (`make bench-groups`). They keep the same annotation; each sees a change before
    /// the others' patches reach it, so each writes it.
    #[arg(
        long,
        env = "KD_BENCH_GROUPS",
        value_delimiter = ',',
        default_value = "1",
        value_parser = positive()
    )]
    groups: Vec<usize>,

    /// Namespaces each scenario's objects are spread over. With 1, one namespace per kind and
    /// count holds them all; with more, each of them holds `objects / namespaces` objects
    /// (every count must divide evenly), labelled, and every controller (and every group on the
    /// tier) watches all namespaces with that label selector. Not with kube-rs-metadata, which
    /// watches one namespace. With `--ring-key namespace` the tier then lists and watches once
    /// in all (`make bench-groups NAMESPACES=1000`).
    #[arg(long, env = "KD_BENCH_NAMESPACES", default_value_t = 1, value_parser = positive())]
    namespaces: usize,

    /// The dispatchers' ring key (`--ring-key` of kube-dispatch-dispatcher): name or
    /// namespace; default: the dispatcher's own default (name).
    #[arg(long, env = "KD_BENCH_RING_KEY", value_parser = ["name", "namespace"])]
    ring_key: Option<String>,

    /// Kinds of object, comma-separated: config-map, record (a custom resource).
    #[arg(
        long,
        env = "KD_BENCH_KINDS",
        value_enum,
        value_delimiter = ',',
        default_value = "config-map,record"
    )]
    kinds: Vec<Kind>,

    /// Mix the resources: the K controllers of each scenario are spread over the kinds of
    /// --kinds in turn (controller g reconciles every object of the (g mod kinds)th kind), each
    /// kind with the same objects in the same namespaces, and the timed writes go to the kinds
    /// in turn; the tier then watches each resource once for all its controllers. Without it,
    /// each kind is a scenario of its own. Needs two kinds or more, and every count of
    /// --groups at least the number of kinds (`make bench-groups MIX=1`).
    #[arg(long, env = "KD_BENCH_MIX")]
    mix: bool,

    /// ConfigMaps each object owns and the controller keeps (`make bench-owners`): needs
    /// `--kinds record`, one controller, and no metadata-only variant. The timed writes then
    /// alternate between an owner (its children follow) and one of its children (the
    /// controller repairs it), each timed to the owner's next reconcile. With `--namespaces`,
    /// the owners are a set of their own, and each child carries its owner's label, so every
    /// controller selects its children with the owners' selector. 0: none.
    #[arg(long, env = "KD_BENCH_CHILDREN", default_value_t = 0)]
    children: usize,

    /// Also records, in each run's log directory, where the timed writes' API-server work went:
    /// `requests-timed.txt` (every resource and verb the API server counted from the quiet
    /// after the cold start until every write was reconciled) and `apiserver-timed.pprof` (a
    /// CPU profile of the API server over the timed writes; compare two runs with
    /// `go tool pprof -top -diff_base=<one> <other>`). The profile adds to the API server's CPU.
    /// Needs a control plane started with `KD_APISERVER_PROFILING=true`.
    #[arg(long, env = "KD_BENCH_PROFILE_APISERVER")]
    profile_apiserver: bool,

    /// Variants, comma-separated: kube-rs, kube-rs-streaming (its watcher lists by streaming,
    /// not in pages), kube-rs-metadata, controller-runtime, controller-runtime-metadata (both
    /// need --controller-runtime), dispatch-<replicas> (the dispatchers list each resource
    /// whole, their default, whatever KD_LIST_MODE says), dispatch-paged-<replicas> and
    /// dispatch-stream-<replicas> (they list in pages of 500, or by streaming),
    /// go-dispatch-<replicas> (the controller-runtime controller on the Go SDK: needs
    /// --controller-runtime-dispatch), and with --children dispatch-list-<replicas> (each
    /// reconcile lists its children instead of reading them from its request). The
    /// incumbents' figures are divided by each variant of the Rust SDK with one replica.
    #[arg(
        long,
        env = "KD_BENCH_VARIANTS",
        value_delimiter = ',',
        default_value = "kube-rs,kube-rs-metadata,dispatch-1,dispatch-4"
    )]
    variants: Vec<Variant>,

    /// Dispatchers in the tier of the dispatch-N variants.
    #[arg(long, env = "KD_BENCH_DISPATCHERS", default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=16))]
    dispatchers: u16,

    /// Runs of each variant per scenario; tables show medians.
    #[arg(long, env = "KD_BENCH_REPEATS", default_value_t = 3, value_parser = positive())]
    repeats: usize,

    /// Writes timed per run (to distinct objects, spread over the namespace).
    #[arg(long, env = "KD_BENCH_WRITES", default_value_t = 200, value_parser = positive())]
    writes: usize,

    /// Pause between two timed writes.
    #[arg(long, env = "KD_BENCH_WRITE_INTERVAL", value_parser = humantime::parse_duration, default_value = "20ms")]
    write_interval: Duration,

    /// Size of each object's `config.yaml`, bytes.
    #[arg(long, env = "KD_BENCH_OBJECT_BYTES", default_value_t = OBJECT_BYTES)]
    object_bytes: usize,

    /// The benchmark controller on controller-runtime (Go), for the controller-runtime
    /// variants; `bench/controller-runtime/build.sh` builds it and prints its path.
    #[arg(long, env = "KD_BENCH_CONTROLLER_RUNTIME")]
    controller_runtime: Option<PathBuf>,

    /// That controller ported to the kube-dispatch Go SDK (bench/controller-runtime-dispatch),
    /// for the go-dispatch variants; `bench/controller-runtime/build.sh dispatch` builds it and
    /// prints its path.
    #[arg(long, env = "KD_BENCH_CONTROLLER_RUNTIME_DISPATCH")]
    controller_runtime_dispatch: Option<PathBuf>,

    /// Directory for the PNG plots (linked from --out by a path relative to it).
    #[arg(long, env = "KD_BENCH_PLOTS_DIR", default_value = "bench/results")]
    plots_dir: PathBuf,

    /// Output of the dispatch-core micro-benchmark to include (`make bench` passes it).
    #[arg(long, env = "KD_BENCH_CORE_RESULTS")]
    core_results: Option<PathBuf>,

    /// TrueType font for the plots; default: the system's sans-serif (fc-match).
    #[arg(long, env = "KD_BENCH_FONT")]
    font: Option<PathBuf>,

    /// Which section of --out to replace: the one between `<!-- bench:<section>:begin -->` and
    /// `<!-- bench:<section>:end -->`. Plots of a section other than `default` carry its name.
    #[arg(long, env = "KD_BENCH_SECTION", default_value = "default", value_parser = section_name)]
    section: String,

    /// Where the processes' binaries are, and where they log.
    #[command(flatten)]
    processes: Processes,

    /// Where the results go.
    #[command(flatten)]
    output: Output,
}

impl CompareArgs {
    /// What no value parser can check alone: the flags against each other.
    fn check(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            !self.variants.is_empty(),
            "--variants must name at least one"
        );
        anyhow::ensure!(
            !self.groups.is_empty(),
            "--groups must name at least one count"
        );
        let namespaces = self.namespaces;
        if let Some(objects) = self.objects.iter().find(|o| *o % namespaces != 0) {
            anyhow::bail!(
                "--objects {objects} do not divide evenly over --namespaces {namespaces}"
            );
        }
        if self.mix {
            let mut kinds = self.kinds.clone();
            kinds.sort();
            kinds.dedup();
            anyhow::ensure!(
                kinds.len() >= 2 && kinds.len() == self.kinds.len(),
                "--mix spreads the controllers over the kinds: give two distinct kinds or more in --kinds"
            );
            if let Some(groups) = self.groups.iter().find(|g| **g < kinds.len()) {
                anyhow::bail!(
                    "--groups {groups} cannot cover the {} kinds of --mix: give each kind a controller at least",
                    kinds.len()
                );
            }
        }
        if self.children > 0 {
            anyhow::ensure!(
                self.kinds == [Kind::Record] && !self.mix,
                "--children needs --kinds record, without --mix"
            );
            anyhow::ensure!(
                self.groups == [1],
                "--children runs one controller: --groups 1"
            );
            anyhow::ensure!(
                !self.variants.iter().any(|v| matches!(
                    v,
                    Variant::KubeRsMetadata
                        | Variant::ControllerRuntimeMetadata
                        | Variant::KubeRsStreaming
                )),
                "--children has no metadata-only variant (its controllers read their children's content) and no kube-rs-streaming"
            );
        } else {
            anyhow::ensure!(
                !self
                    .variants
                    .iter()
                    .any(|v| matches!(v, Variant::DispatchList(_))),
                "dispatch-list-N lists children: it needs --children"
            );
        }
        anyhow::ensure!(
            namespaces == 1 || !self.variants.contains(&Variant::KubeRsMetadata),
            "kube-rs-metadata watches one namespace: leave it out of --variants with --namespaces {namespaces}"
        );
        let wants_controller_runtime = self.variants.iter().any(|v| {
            matches!(
                v,
                Variant::ControllerRuntime | Variant::ControllerRuntimeMetadata
            )
        });
        match &self.controller_runtime {
            Some(path) => anyhow::ensure!(
                path.is_file(),
                "{} does not exist: build it with bench/controller-runtime/build.sh",
                path.display()
            ),
            None => anyhow::ensure!(
                !wants_controller_runtime,
                "the controller-runtime variants need --controller-runtime PATH (bench/controller-runtime/build.sh prints it)"
            ),
        }
        let wants_go_sdk = self
            .variants
            .iter()
            .any(|v| matches!(v, Variant::GoDispatch(_)));
        match &self.controller_runtime_dispatch {
            Some(path) => anyhow::ensure!(
                path.is_file(),
                "{} does not exist: build it with bench/controller-runtime/build.sh dispatch",
                path.display()
            ),
            None => anyhow::ensure!(
                !wants_go_sdk,
                "the go-dispatch variants need --controller-runtime-dispatch PATH (bench/controller-runtime/build.sh dispatch prints it)"
            ),
        }
        Ok(())
    }
}

/// The flags of `security`.
#[derive(clap::Args, Debug)]
struct SecurityArgs {
    /// Runs of each mode (security off, on), alternating; tables show medians.
    #[arg(long, env = "KD_BENCH_REPEATS", default_value_t = 3, value_parser = positive())]
    repeats: usize,

    /// Writes timed per run, one at a time.
    #[arg(long, env = "KD_BENCH_WRITES", default_value_t = 200, value_parser = positive())]
    writes: usize,

    /// Sessions opened and timed per run, each in a group of its own (at least 2: the first
    /// is shown apart).
    #[arg(long, env = "KD_BENCH_SECURITY_OPENS", default_value_t = 50)]
    opens: usize,

    /// Sessions polling in the review window.
    #[arg(long, env = "KD_BENCH_SECURITY_SESSIONS", default_value_t = 1_000, value_parser = positive())]
    sessions: usize,

    /// ServiceAccounts those sessions belong to.
    #[arg(long, env = "KD_BENCH_SECURITY_IDENTITIES", default_value_t = 10, value_parser = positive())]
    identities: usize,

    /// How long the sessions poll; longer than the 2-minute review caches, so their renewal
    /// is counted.
    #[arg(long, env = "KD_BENCH_SECURITY_WINDOW", value_parser = humantime::parse_duration, default_value = "150s")]
    window: Duration,

    /// Where the results go.
    #[command(flatten)]
    output: Output,
}

/// The flags of `hostile`.
#[derive(clap::Args, Debug)]
struct HostileArgs {
    /// Runs of each attack (and of the baseline), in rotating order; tables show medians.
    #[arg(long, env = "KD_BENCH_REPEATS", default_value_t = 3, value_parser = positive())]
    repeats: usize,

    /// Writes the legitimate controller times per run, one at a time.
    #[arg(long, env = "KD_BENCH_WRITES", default_value_t = 100, value_parser = positive())]
    writes: usize,

    /// Where the dispatcher's binary is (--bin-dir), and where it logs.
    #[command(flatten)]
    processes: Processes,

    /// Where the results go.
    #[command(flatten)]
    output: Output,
}

/// The flags of `metrics`.
#[derive(clap::Args, Debug)]
struct MetricsArgs {
    /// ConfigMaps, each patched once per run, all at once (one count).
    #[arg(long, default_value_t = 2000, value_parser = positive())]
    objects: usize,

    /// Runs of each mode (metrics off, on), alternating; tables show medians.
    #[arg(long, env = "KD_BENCH_REPEATS", default_value_t = 5, value_parser = positive())]
    repeats: usize,

    /// Where the results go.
    #[command(flatten)]
    output: Output,
}

/// The flags of `ceiling`.
#[derive(clap::Args, Debug)]
struct CeilingArgs {
    /// ConfigMaps the writer patches in turn (one count).
    #[arg(long, default_value_t = 2000, value_parser = positive())]
    objects: usize,

    /// Size of each object's `config.yaml`, bytes.
    #[arg(long, env = "KD_BENCH_OBJECT_BYTES", default_value_t = OBJECT_BYTES)]
    object_bytes: usize,

    /// Target write rates, writes per second, comma-separated, in the order run.
    #[arg(
        long,
        env = "KD_BENCH_CEILING_RATES",
        value_delimiter = ',',
        default_value = "100,250,500,1000,2000",
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    rates: Vec<u32>,

    /// How long each rate is held.
    #[arg(long, env = "KD_BENCH_CEILING_WINDOW", value_parser = humantime::parse_duration, default_value = "10s")]
    window: Duration,

    /// Where the processes' binaries are, and where they log.
    #[command(flatten)]
    processes: Processes,

    /// Where the results go.
    #[command(flatten)]
    output: Output,
}

/// The flags of `shards`.
#[derive(clap::Args, Debug)]
struct ShardsArgs {
    /// Namespaces the objects are spread over (`kd-<i>-bench-shard-<objects>`).
    #[arg(long, env = "KD_BENCH_SHARD_NAMESPACES", default_value_t = 1000, value_parser = positive())]
    namespaces: usize,

    /// Labelled ConfigMaps in each namespace (one count).
    #[arg(long, default_value_t = 100, value_parser = positive())]
    objects: usize,

    /// Size of each object's `config.yaml`, bytes.
    #[arg(long, env = "KD_BENCH_OBJECT_BYTES", default_value_t = OBJECT_BYTES)]
    object_bytes: usize,

    /// Dispatchers in the tier of each ring key.
    #[arg(long, env = "KD_BENCH_DISPATCHERS", default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=16))]
    dispatchers: u16,

    /// Writes timed after the cold start, spread over the namespaces.
    #[arg(long, env = "KD_BENCH_WRITES", default_value_t = 1000, value_parser = positive())]
    writes: usize,

    /// Pause between two timed writes.
    #[arg(long, env = "KD_BENCH_WRITE_INTERVAL", value_parser = humantime::parse_duration, default_value = "10ms")]
    write_interval: Duration,

    /// Where the processes' binaries are, and where they log.
    #[command(flatten)]
    processes: Processes,

    /// Where the results go.
    #[command(flatten)]
    output: Output,
}

fn section_name(s: &str) -> Result<String, String> {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        Ok(s.to_owned())
    } else {
        Err("use lowercase letters, digits and '-'".to_owned())
    }
}

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
    let section = format!(
        "Produced by `{}` on {} ({objects} ConfigMaps of {} bytes, one dispatcher, one SDK replica, each rate held {}, at most {} patches in flight, security off).\n\n- Machine: {}\n- Binaries: {}\n\n{table}",
        args.output.command("make bench-ceiling"),
        humantime::format_rfc3339_seconds(SystemTime::now()),
        args.object_bytes,
        humantime::format_duration(args.window),
        harness::ceiling::WRITERS,
        machine(),
        build_profile(&args.processes.bin_dir()),
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
    let section = format!(
        "Produced by `{}` on {} ({namespaces} namespaces of {objects} ConfigMaps of {} bytes, {} dispatchers, one SDK replica over every namespace; {} writes {} apart; security off).\n\n- Machine: {}\n- Binaries: {}\n\n{table}",
        args.output.command("make bench-shards"),
        humantime::format_rfc3339_seconds(SystemTime::now()),
        args.object_bytes,
        args.dispatchers,
        args.writes,
        humantime::format_duration(args.write_interval),
        machine(),
        build_profile(&args.processes.bin_dir()),
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
    let section = format!(
        "Produced by `{}` on {} (one dispatcher in the benchmark's process; {} timed writes and {} OpenSessions per run).\n\n- Machine: {}\n- Binaries: {}\n\n{table}",
        args.output.command("make bench-security"),
        humantime::format_rfc3339_seconds(SystemTime::now()),
        args.writes,
        args.opens,
        machine(),
        build_profile(&own_dir()),
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
    let section = format!(
        "Produced by `{}` on {} (one dispatcher process, TLS and token reviews on, every bound at its default but the body pool; a legitimate controller in the benchmark's process; the attackers beside it, all on loopback).\n\n- Machine: {}\n- Binaries: {}\n\n{table}",
        args.output.command("make bench-hostile"),
        humantime::format_rfc3339_seconds(SystemTime::now()),
        machine(),
        build_profile(&args.processes.bin_dir()),
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
    let section = format!(
        "Produced by `{}` on {} (one dispatcher and one controller replica in the benchmark's process, security off, a reconcile that does nothing).\n\n- Machine: {}\n- Binaries: {}\n\n{table}",
        args.output.command("make bench-metrics"),
        humantime::format_rfc3339_seconds(SystemTime::now()),
        machine(),
        build_profile(&own_dir()),
    );
    args.output.write("metrics", &section, &results)
}

/// Writes `figures` into `path` as JSON (creating its directory).
fn write_json(path: &Path, figures: &impl Serialize) -> anyhow::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let mut json =
        serde_json::to_string_pretty(figures).context("cannot encode the figures as JSON")?;
    json.push('\n');
    std::fs::write(path, json).with_context(|| format!("cannot write {}", path.display()))
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

fn command_output(program: &Path, args: &[&str]) -> String {
    std::process::Command::new(program)
        .args(args)
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.lines().next().map(str::to_owned))
        .unwrap_or_else(|| "unknown".to_owned())
}

/// The directory this benchmark's binary is in: where `cargo build` put the binaries it
/// starts, built with the same profile.
fn own_dir() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(Path::to_path_buf))
        .unwrap_or_else(|| PathBuf::from("target/dist"))
}

/// How the binaries in `dir` were built, from the name of cargo's profile directory.
fn build_profile(dir: &Path) -> String {
    match dir.file_name().and_then(|n| n.to_str()) {
        Some("dist") => {
            "`cargo build --profile dist` (release, fat link-time optimisation, one codegen unit)"
                .to_string()
        }
        Some("release") => "`cargo build --release`".to_string(),
        Some("debug") => "`cargo build` (unoptimised)".to_string(),
        Some(other) => format!("cargo's `{other}` profile"),
        None => "unknown".to_string(),
    }
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines().find_map(|l| {
                l.strip_prefix("model name")
                    .map(|m| m.trim_start_matches([' ', '\t', ':']).to_owned())
            })
        })
        .unwrap_or_else(|| "unknown CPU".to_owned());
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    let memory = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            let kib: f64 = m.lines().next()?.split_whitespace().nth(1)?.parse().ok()?;
            Some(format!("{:.0} GiB", kib / 1024.0 / 1024.0))
        })
        .unwrap_or_default();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!(
        "{cpu}, {cores} cores available, {memory} memory, Linux {}",
        kernel.trim()
    )
}

fn crate_version(root: &Path, name: &str) -> String {
    let lock = std::fs::read_to_string(root.join("Cargo.lock")).unwrap_or_default();
    let header = format!("name = \"{name}\"\nversion = \"");
    lock.find(&header)
        .and_then(|at| {
            lock[at + header.len()..]
                .split('"')
                .next()
                .map(str::to_owned)
        })
        .unwrap_or_else(|| "unknown".to_owned())
}

/// The Markdown written between the markers of --out.
fn results_section(
    args: &CompareArgs,
    root: &Path,
    scenarios: &[Scenario],
    plots: &[(String, PathBuf)],
) -> anyhow::Result<String> {
    let bin_dir = std::process::Command::new(root.join("tests/cluster/build-binaries.sh"))
        .arg("--print-dir")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| PathBuf::from(s.trim()))
        .unwrap_or_default();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Produced by `{}` on {} (runs of each variant: {}; timed writes per run: {}, {} apart; data per object: {} bytes; dispatchers: {}, ring keyed by {}{}{}).\n",
        args.output.command("make bench"),
        humantime::format_rfc3339_seconds(SystemTime::now()),
        args.repeats,
        args.writes,
        humantime::format_duration(args.write_interval),
        args.object_bytes,
        args.dispatchers,
        args.ring_key.as_deref().unwrap_or("name"),
        if args.namespaces == 1 {
            String::new()
        } else {
            format!(
                "; objects spread over {} namespaces, every controller over all namespaces with a label selector{}",
                args.namespaces,
                if args.children > 0 {
                    " (the children carry their owner's label)"
                } else {
                    ""
                }
            )
        },
        if args.mix {
            format!(
                "; a mix of resources: controller g reconciles every object of the (g mod {})th of {}, the timed writes go to them in turn, and the API requests are summed over their resources",
                args.kinds.len(),
                objects::titles(&args.kinds)
            )
        } else {
            String::new()
        },
    );
    let _ = writeln!(out, "- Machine: {}", machine());
    let _ = writeln!(
        out,
        "- Versions: {}; kube-apiserver {}; etcd {}; kube (kube-rs) {}; tonic {}",
        command_output(Path::new("rustc"), &["--version"]),
        command_output(&bin_dir.join("kube-apiserver"), &["--version"])
            .trim_start_matches("Kubernetes "),
        command_output(&bin_dir.join("etcd"), &["--version"]).trim_start_matches("etcd Version: "),
        crate_version(root, "kube"),
        crate_version(root, "tonic"),
    );
    let _ = writeln!(
        out,
        "- Binaries: {}\n",
        build_profile(&args.processes.bin_dir())
    );
    for s in scenarios {
        let _ = writeln!(out, "{}", s.table());
    }
    if let Some(path) = &args.core_results {
        let core = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let lines: Vec<&str> = core
            .lines()
            .filter(|l| l.starts_with("dispatch core") || l.starts_with("  "))
            .collect();
        let _ = writeln!(
            out,
            "#### Dispatch core, synthetic events (`make bench-core`)\n\n```\n{}\n```\n",
            lines.join("\n")
        );
    }
    let out_dir = args.output.out.parent().unwrap_or(Path::new(""));
    for (title, path) in plots {
        let relative = path.strip_prefix(out_dir).unwrap_or(path);
        let _ = writeln!(out, "![{title}]({})\n", relative.display());
    }
    Ok(out)
}

/// Replaces what lies between the markers of `name` in `path` (creating the file if it does not
/// exist, appending the section if the file lacks it).
fn write_section(path: &Path, name: &str, section: &str) -> anyhow::Result<()> {
    let begin_marker = format!("<!-- bench:{name}:begin -->");
    let end_marker = format!("<!-- bench:{name}:end -->");
    let mut current = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    if !current.contains(&begin_marker) {
        current.push_str(&format!("\n{begin_marker}\n{end_marker}\n"));
    }
    let (Some(begin), Some(end)) = (current.find(&begin_marker), current.find(&end_marker)) else {
        anyhow::bail!("{} has {begin_marker} but not {end_marker}", path.display());
    };
    anyhow::ensure!(
        begin < end,
        "{}: the markers of {name} are out of order",
        path.display()
    );
    let updated = format!(
        "{}{begin_marker}\n{section}{}",
        &current[..begin],
        &current[end..]
    );
    std::fs::write(path, updated).with_context(|| format!("cannot write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    use super::*;

    fn parse(args: &[&str]) -> Result<Bench, clap::Error> {
        Cli::try_parse_from(std::iter::once("kube-dispatch-bench").chain(args.iter().copied()))
            .map(|cli| cli.bench)
    }

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn every_benchmark_is_a_subcommand_and_one_is_needed() {
        assert!(parse(&[]).is_err());
        assert!(parse(&["--security"]).is_err());
        for name in [
            "compare", "security", "hostile", "metrics", "ceiling", "shards",
        ] {
            assert!(parse(&[name]).is_ok(), "{name}");
        }
    }

    #[test]
    fn the_defaults_the_make_targets_relied_on_are_the_subcommands_own() {
        let Ok(Bench::Shards(shards)) = parse(&["shards"]) else {
            panic!("shards parses");
        };
        assert_eq!(
            (shards.namespaces, shards.objects, shards.writes),
            (1000, 100, 1000)
        );
        assert_eq!(shards.write_interval, Duration::from_millis(10));
        let Ok(Bench::Ceiling(ceiling)) = parse(&["ceiling", "--rates", "20,40", "--window", "1s"])
        else {
            panic!("ceiling parses");
        };
        assert_eq!(
            (ceiling.objects, ceiling.rates, ceiling.window),
            (2000, vec![20, 40], Duration::from_secs(1))
        );
        let Ok(Bench::Metrics(metrics)) = parse(&["metrics"]) else {
            panic!("metrics parses");
        };
        assert_eq!((metrics.objects, metrics.repeats), (2000, 5));
        let Ok(Bench::Hostile(hostile)) = parse(&["hostile"]) else {
            panic!("hostile parses");
        };
        assert_eq!((hostile.repeats, hostile.writes), (3, 100));
        let Ok(Bench::Security(security)) = parse(&["security"]) else {
            panic!("security parses");
        };
        assert_eq!(
            (security.repeats, security.writes, security.opens),
            (3, 200, 50)
        );
        assert_eq!(
            security.output.command("make bench-security"),
            "make bench-security"
        );
    }

    #[test]
    fn counts_must_be_positive_and_flags_belong_to_their_subcommand() {
        for args in [
            &["compare", "--objects", "10,0"][..],
            &["compare", "--repeats", "0"],
            &["compare", "--namespaces", "0"],
            &["compare", "--dispatchers", "17"],
            &["metrics", "--objects", "0"],
            &["ceiling", "--rates", "100,0"],
            &["shards", "--namespaces", "0"],
            &["security", "--sessions", "0"],
            &["security", "--identities", "0"],
            &["hostile", "--writes", "0"],
            // Each subcommand has only the flags it uses.
            &["metrics", "--bin-dir", "x"],
            &["security", "--plots-dir", "x"],
            &["ceiling", "--variants", "kube-rs"],
        ] {
            assert!(parse(args).is_err(), "{args:?} parsed");
        }
    }
}
