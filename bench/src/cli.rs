//! The command line: one subcommand per benchmark, the settings they share (where results go, the
//! processes they start) and each one's own.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use clap::{Parser, Subcommand, builder::RangedU64ValueParser};
use serde::Serialize;

use crate::{
    OBJECT_BYTES,
    harness::run::Binaries,
    markdown::{own_dir, produced, write_json, write_section},
};

mod compare;
pub(crate) use compare::{CompareArgs, SecurityArgs};

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
pub(crate) struct Cli {
    /// The benchmark to run.
    #[command(subcommand)]
    pub(crate) bench: Bench,
}

/// The benchmarks, one per subcommand.
#[derive(Subcommand, Debug)]
pub(crate) enum Bench {
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
    /// tokens, a connection flood, a body hog, a reconnect storm, a handshake flood with silent TLS
    /// connections), `--repeats` times each; with the lost writes,
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

    /// The events a controller meets every day, each controller in the shape it runs in
    /// production (`make bench-daily`).
    ///
    /// `--objects` ConfigMaps, and each `--shapes`: a kube-rs controller as two replicas with a
    /// cold standby (kube-lease-manager), controller-runtime as two replicas under its leader
    /// election with a cold standby and with a warm one (EnableWarmup; both need
    /// `--controller-runtime`), and the tier (`--dispatchers` dispatchers, the load balancer and
    /// a standby one, two SDK replicas). Each starts cold, reconciles every object, then meets,
    /// while `--writes` objects are written in turn every `--write-interval`: a steady window
    /// (each of them written once), a rollout of its replicas one at a time (new one ready, old
    /// one sent SIGTERM), and for the tier a rolling upgrade of its dispatchers. Per event: the
    /// API server's CPU, above what the steady window's rate would have spent in as long, its
    /// requests on ConfigMaps, and write-to-reconcile p50, p99 and max; `--repeats` runs of each
    /// shape, medians. Written into the `daily` section of `--out`.
    Daily(DailyArgs),
}

/// Where a benchmark writes its results.
#[derive(clap::Args, Debug)]
pub(crate) struct Output {
    /// Where the results go: a folder, which holds one page per section (`<section>.md`, the
    /// benchmark's own page, linked from BENCHMARKS.md's headline table), or a Markdown file
    /// (a path ending in `.md`) that holds every section. The section's tables are written
    /// between its markers (the page created if it does not exist, the section appended if it
    /// lacks them); plots are linked relative to the page.
    #[arg(long, env = "KD_BENCH_OUT", default_value = "bench/results")]
    pub(crate) out: PathBuf,

    /// How this run was started, as written into --out; default: the benchmark's make target
    /// (`make bench`, `make bench-security`, ...).
    #[arg(long, env = "KD_BENCH_COMMAND")]
    pub(crate) command: Option<String>,

    /// Also write the figures into this JSON file (replaced): those of the tables, at full
    /// precision, each under a stable snake_case key; `null` where a table shows none.
    #[arg(long, env = "KD_BENCH_JSON", value_name = "PATH")]
    pub(crate) json: Option<PathBuf>,
}

impl Output {
    /// --command, or the benchmark's make target.
    pub(crate) fn command<'a>(&'a self, make_target: &'a str) -> &'a str {
        self.command.as_deref().unwrap_or(make_target)
    }

    /// The page that holds section `name`.
    pub(crate) fn page(&self, name: &str) -> PathBuf {
        if self.out.extension().is_some_and(|e| e == "md") {
            self.out.clone()
        } else {
            self.out.join(format!("{name}.md"))
        }
    }

    /// The folder of the pages, which their links to plots are relative to.
    pub(crate) fn pages_dir(&self) -> &Path {
        if self.out.extension().is_some_and(|e| e == "md") {
            self.out.parent().unwrap_or(Path::new(""))
        } else {
            &self.out
        }
    }

    /// Prints `table`, then writes it into section `name` of its page under the header that
    /// says how it was produced (`make_target` unless --command says otherwise, `what` ran, with
    /// the binaries of `bin_dir`), and `figures` into --json if asked for.
    pub(crate) fn publish(
        &self,
        (name, make_target): (&str, &str),
        what: &str,
        bin_dir: &Path,
        table: &str,
        figures: &impl Serialize,
    ) -> anyhow::Result<()> {
        println!("\n{table}");
        let section = produced(self.command(make_target), what, bin_dir, table);
        self.write(name, &section, figures)
    }

    /// Writes `section` between the markers of `name` in its page, then `figures` into --json
    /// if asked for.
    pub(crate) fn write(
        &self,
        name: &str,
        section: &str,
        figures: &impl Serialize,
    ) -> anyhow::Result<()> {
        let page = self.page(name);
        write_section(&page, name, section)?;
        println!("bench: results written to {}", page.display());
        if let Some(path) = &self.json {
            write_json(path, figures)?;
            println!("bench: figures written to {}", path.display());
        }
        Ok(())
    }
}

/// The processes a benchmark starts: where their binaries are, and where they log.
#[derive(clap::Args, Debug)]
pub(crate) struct Processes {
    /// Directory of the binaries: kube-dispatch-dispatcher, kube-dispatch-loadbalancer,
    /// bench-controller [default: the directory of this benchmark's own binary, target/dist
    /// as `make bench` builds it]
    #[arg(long, env = "KD_BENCH_BIN_DIR")]
    pub(crate) bin_dir: Option<PathBuf>,

    /// Where each run's process logs go.
    #[arg(long, env = "KD_BENCH_LOGS", default_value = "target/bench/logs")]
    pub(crate) logs: PathBuf,
}

impl Processes {
    /// --bin-dir, or the directory this benchmark's binary was built into.
    pub(crate) fn bin_dir(&self) -> PathBuf {
        self.bin_dir.clone().unwrap_or_else(own_dir)
    }

    /// The dispatcher, the load balancer and the benchmark controller in --bin-dir, each
    /// checked to exist, with the controller-runtime incumbent if given.
    pub(crate) fn binaries(
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
pub(crate) fn positive() -> RangedU64ValueParser<usize> {
    RangedU64ValueParser::new().range(1..)
}

/// The flags of `hostile`.
#[derive(clap::Args, Debug)]
pub(crate) struct HostileArgs {
    /// Runs of each attack (and of the baseline), in rotating order; tables show medians.
    #[arg(long, env = "KD_BENCH_REPEATS", default_value_t = 3, value_parser = positive())]
    pub(crate) repeats: usize,

    /// Writes the legitimate controller times per run, one at a time.
    #[arg(long, env = "KD_BENCH_WRITES", default_value_t = 100, value_parser = positive())]
    pub(crate) writes: usize,

    /// Only these attacks, comma-separated (every attack if not given); the baseline (`none`)
    /// runs in any case, since every ratio is taken against it.
    #[arg(long, env = "KD_BENCH_ATTACKS", value_enum, value_delimiter = ',')]
    pub(crate) attacks: Vec<crate::harness::hostile::Attack>,

    /// Where the dispatcher's binary is (--bin-dir), and where it logs.
    #[command(flatten)]
    pub(crate) processes: Processes,

    /// Where the results go.
    #[command(flatten)]
    pub(crate) output: Output,
}

/// The flags of `metrics`.
#[derive(clap::Args, Debug)]
pub(crate) struct MetricsArgs {
    /// ConfigMaps, each patched once per run, all at once (one count).
    #[arg(long, default_value_t = 2000, value_parser = positive())]
    pub(crate) objects: usize,

    /// Runs of each mode (metrics off, on), alternating; tables show medians.
    #[arg(long, env = "KD_BENCH_REPEATS", default_value_t = 5, value_parser = positive())]
    pub(crate) repeats: usize,

    /// Where the results go.
    #[command(flatten)]
    pub(crate) output: Output,
}

/// The flags of `ceiling`.
#[derive(clap::Args, Debug)]
pub(crate) struct CeilingArgs {
    /// ConfigMaps the writer patches in turn (one count).
    #[arg(long, default_value_t = 2000, value_parser = positive())]
    pub(crate) objects: usize,

    /// Size of each object's `config.yaml`, bytes.
    #[arg(long, env = "KD_BENCH_OBJECT_BYTES", default_value_t = OBJECT_BYTES)]
    pub(crate) object_bytes: usize,

    /// Target write rates, writes per second, comma-separated, in the order run.
    #[arg(
        long,
        env = "KD_BENCH_CEILING_RATES",
        value_delimiter = ',',
        default_value = "100,250,500,1000,2000",
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub(crate) rates: Vec<u32>,

    /// How long each rate is held.
    #[arg(long, env = "KD_BENCH_CEILING_WINDOW", value_parser = humantime::parse_duration, default_value = "10s")]
    pub(crate) window: Duration,

    /// Where the processes' binaries are, and where they log.
    #[command(flatten)]
    pub(crate) processes: Processes,

    /// Where the results go.
    #[command(flatten)]
    pub(crate) output: Output,
}

/// The flags of `shards`.
#[derive(clap::Args, Debug)]
pub(crate) struct ShardsArgs {
    /// Namespaces the objects are spread over (`kd-<i>-bench-shard-<objects>`).
    #[arg(long, env = "KD_BENCH_SHARD_NAMESPACES", default_value_t = 1000, value_parser = positive())]
    pub(crate) namespaces: usize,

    /// Labelled ConfigMaps in each namespace (one count).
    #[arg(long, default_value_t = 100, value_parser = positive())]
    pub(crate) objects: usize,

    /// Size of each object's `config.yaml`, bytes.
    #[arg(long, env = "KD_BENCH_OBJECT_BYTES", default_value_t = OBJECT_BYTES)]
    pub(crate) object_bytes: usize,

    /// Dispatchers in the tier of each ring key.
    #[arg(long, env = "KD_BENCH_DISPATCHERS", default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=16))]
    pub(crate) dispatchers: u16,

    /// Writes timed after the cold start, spread over the namespaces.
    #[arg(long, env = "KD_BENCH_WRITES", default_value_t = 1000, value_parser = positive())]
    pub(crate) writes: usize,

    /// Pause between two timed writes.
    #[arg(long, env = "KD_BENCH_WRITE_INTERVAL", value_parser = humantime::parse_duration, default_value = "10ms")]
    pub(crate) write_interval: Duration,

    /// Where the processes' binaries are, and where they log.
    #[command(flatten)]
    pub(crate) processes: Processes,

    /// Where the results go.
    #[command(flatten)]
    pub(crate) output: Output,
}

/// The flags of `daily`.
#[derive(clap::Args, Debug)]
pub(crate) struct DailyArgs {
    /// Objects the controllers reconcile (one count): ConfigMaps, or with `--children` Records.
    #[arg(long, env = "KD_BENCH_OBJECTS", default_value_t = 10_000, value_parser = positive())]
    pub(crate) objects: usize,

    /// ConfigMaps each object owns and the controller keeps equal to a hash of its owner's data
    /// (0: none). With children the objects are Records, and the writer changes an owner and a
    /// child in turn; the controllers find their children as in `compare --children` (the tier
    /// from its requests).
    #[arg(long, env = "KD_BENCH_CHILDREN", default_value_t = 0)]
    pub(crate) children: usize,

    /// Size of each object's `config.yaml`, bytes.
    #[arg(long, env = "KD_BENCH_OBJECT_BYTES", default_value_t = OBJECT_BYTES)]
    pub(crate) object_bytes: usize,

    /// The shapes, comma-separated, run in turn (rotating with each repeat).
    #[arg(
        long,
        env = "KD_BENCH_SHAPES",
        value_enum,
        value_delimiter = ',',
        default_value = "kube-rs-standby,controller-runtime-leader,controller-runtime-warm,tier"
    )]
    pub(crate) shapes: Vec<crate::harness::run::daily::Shape>,

    /// Runs of each shape; tables show medians.
    #[arg(long, env = "KD_BENCH_REPEATS", default_value_t = 3, value_parser = positive())]
    pub(crate) repeats: usize,

    /// Dispatchers in the tier.
    #[arg(long, env = "KD_BENCH_DISPATCHERS", default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=16))]
    pub(crate) dispatchers: u16,

    /// Objects the writer changes in turn, spread over them all; the steady window writes each
    /// once.
    #[arg(long, env = "KD_BENCH_WRITES", default_value_t = 100, value_parser = positive())]
    pub(crate) writes: usize,

    /// Pause between two writes.
    #[arg(long, env = "KD_BENCH_WRITE_INTERVAL", value_parser = humantime::parse_duration, default_value = "100ms")]
    pub(crate) write_interval: Duration,

    /// The benchmark controller on controller-runtime (Go), for its shapes;
    /// `bench/controller-runtime/build.sh` builds it and prints its path.
    #[arg(long, env = "KD_BENCH_CONTROLLER_RUNTIME")]
    pub(crate) controller_runtime: Option<PathBuf>,

    /// Where the processes' binaries are, and where they log.
    #[command(flatten)]
    pub(crate) processes: Processes,

    /// Where the results go.
    #[command(flatten)]
    pub(crate) output: Output,
}

pub(crate) fn section_name(s: &str) -> Result<String, String> {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        Ok(s.to_owned())
    } else {
        Err("use lowercase letters, digits and '-'".to_owned())
    }
}

#[cfg(test)]
mod tests;
