//! The settings of `compare` (`make bench`, `make bench-go`, `make bench-groups`, `make
//! bench-owners`, `make bench-scale`) and of `security`.

use std::{path::PathBuf, time::Duration};

use super::{Output, Processes, positive, section_name};
use crate::{
    OBJECT_BYTES,
    harness::{objects::Kind, run::Variant},
};

/// The flags of `compare`.
#[derive(clap::Args, Debug)]
pub(crate) struct CompareArgs {
    /// Object counts, comma-separated.
    #[arg(
        long,
        env = "KD_BENCH_OBJECTS",
        value_delimiter = ',',
        default_value = "1000,10000",
        value_parser = positive()
    )]
    pub(crate) objects: Vec<usize>,

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
    pub(crate) groups: Vec<usize>,

    /// Namespaces each scenario's objects are spread over. With 1, one namespace per kind and
    /// count holds them all; with more, each of them holds `objects / namespaces` objects
    /// (every count must divide evenly), labelled, and every controller (and every group on the
    /// tier) watches all namespaces with that label selector. Not with kube-rs-metadata, which
    /// watches one namespace. With `--ring-key namespace` the tier then lists and watches once
    /// in all (`make bench-groups NAMESPACES=1000`).
    #[arg(long, env = "KD_BENCH_NAMESPACES", default_value_t = 1, value_parser = positive())]
    pub(crate) namespaces: usize,

    /// The dispatchers' ring key (`--ring-key` of kube-dispatch-dispatcher): name or
    /// namespace; default: the dispatcher's own default (name).
    #[arg(long, env = "KD_BENCH_RING_KEY", value_parser = ["name", "namespace"])]
    pub(crate) ring_key: Option<String>,

    /// Kinds of object, comma-separated: config-map, record (a custom resource).
    #[arg(
        long,
        env = "KD_BENCH_KINDS",
        value_enum,
        value_delimiter = ',',
        default_value = "config-map,record"
    )]
    pub(crate) kinds: Vec<Kind>,

    /// Mix the resources: the K controllers of each scenario are spread over the kinds of
    /// --kinds in turn (controller g reconciles every object of the (g mod kinds)th kind), each
    /// kind with the same objects in the same namespaces, and the timed writes go to the kinds
    /// in turn; the tier then watches each resource once for all its controllers. Without it,
    /// each kind is a scenario of its own. Needs two kinds or more, and every count of
    /// --groups at least the number of kinds (`make bench-groups MIX=1`).
    #[arg(long, env = "KD_BENCH_MIX")]
    pub(crate) mix: bool,

    /// ConfigMaps each object owns and the controller keeps (`make bench-owners`): needs
    /// `--kinds record`, one controller, and no metadata-only variant. The timed writes then
    /// alternate between an owner (its children follow) and one of its children (the
    /// controller repairs it), each timed to the owner's next reconcile. With `--namespaces`,
    /// the owners are a set of their own, and each child carries its owner's label, so every
    /// controller selects its children with the owners' selector. 0: none.
    #[arg(long, env = "KD_BENCH_CHILDREN", default_value_t = 0)]
    pub(crate) children: usize,

    /// Also records, in each run's log directory, where the timed writes' API-server work went:
    /// `requests-timed.txt` (every resource and verb the API server counted from the quiet
    /// after the cold start until every write was reconciled) and `apiserver-timed.pprof` (a
    /// CPU profile of the API server over the timed writes; compare two runs with
    /// `go tool pprof -top -diff_base=<one> <other>`). The profile adds to the API server's CPU.
    /// Needs a control plane started with `KD_APISERVER_PROFILING=true`.
    #[arg(long, env = "KD_BENCH_PROFILE_APISERVER")]
    pub(crate) profile_apiserver: bool,

    /// Variants, comma-separated: kube-rs, kube-rs-streaming (its watcher lists by streaming,
    /// not in pages), kube-rs-metadata, controller-runtime, controller-runtime-metadata (both
    /// need --controller-runtime), dispatch-<replicas> (the dispatchers list each resource
    /// whole, their default, whatever KD_LIST_MODE says), dispatch-paged-<replicas> and
    /// dispatch-stream-<replicas> (they list in pages of 500, or by streaming),
    /// dispatch-alone-<replicas> (whole lists, each dispatcher making its own: --share-lists
    /// false), dispatch-json-<replicas> (built-in resources read in JSON: --protobuf false),
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
    pub(crate) variants: Vec<Variant>,

    /// Dispatchers in the tier of the dispatch-N variants.
    #[arg(long, env = "KD_BENCH_DISPATCHERS", default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=16))]
    pub(crate) dispatchers: u16,

    /// Runs of each variant per scenario; tables show medians.
    #[arg(long, env = "KD_BENCH_REPEATS", default_value_t = 3, value_parser = positive())]
    pub(crate) repeats: usize,

    /// Writes timed per run (to distinct objects, spread over the namespace).
    #[arg(long, env = "KD_BENCH_WRITES", default_value_t = 200, value_parser = positive())]
    pub(crate) writes: usize,

    /// Pause between two timed writes.
    #[arg(long, env = "KD_BENCH_WRITE_INTERVAL", value_parser = humantime::parse_duration, default_value = "20ms")]
    pub(crate) write_interval: Duration,

    /// Size of each object's `config.yaml`, bytes.
    #[arg(long, env = "KD_BENCH_OBJECT_BYTES", default_value_t = OBJECT_BYTES)]
    pub(crate) object_bytes: usize,

    /// The benchmark controller on controller-runtime (Go), for the controller-runtime
    /// variants; `bench/controller-runtime/build.sh` builds it and prints its path.
    #[arg(long, env = "KD_BENCH_CONTROLLER_RUNTIME")]
    pub(crate) controller_runtime: Option<PathBuf>,

    /// That controller ported to the kube-dispatch Go SDK (bench/controller-runtime-dispatch),
    /// for the go-dispatch variants; `bench/controller-runtime/build.sh dispatch` builds it and
    /// prints its path.
    #[arg(long, env = "KD_BENCH_CONTROLLER_RUNTIME_DISPATCH")]
    pub(crate) controller_runtime_dispatch: Option<PathBuf>,

    /// Directory for the PNG plots (linked from --out by a path relative to it).
    #[arg(long, env = "KD_BENCH_PLOTS_DIR", default_value = "bench/results")]
    pub(crate) plots_dir: PathBuf,

    /// Output of the dispatch-core micro-benchmark to include (`make bench` passes it).
    #[arg(long, env = "KD_BENCH_CORE_RESULTS")]
    pub(crate) core_results: Option<PathBuf>,

    /// TrueType font for the plots; default: the system's sans-serif (fc-match).
    #[arg(long, env = "KD_BENCH_FONT")]
    pub(crate) font: Option<PathBuf>,

    /// Which section of --out to replace: the one between `<!-- bench:<section>:begin -->` and
    /// `<!-- bench:<section>:end -->`. Plots of a section other than `default` carry its name.
    #[arg(long, env = "KD_BENCH_SECTION", default_value = "default", value_parser = section_name)]
    pub(crate) section: String,

    /// Where the processes' binaries are, and where they log.
    #[command(flatten)]
    pub(crate) processes: Processes,

    /// Where the results go.
    #[command(flatten)]
    pub(crate) output: Output,
}

impl CompareArgs {
    /// What no value parser can check alone: the flags against each other.
    pub(crate) fn check(&self) -> anyhow::Result<()> {
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
                    .any(|v| matches!(v, Variant::DispatchList(_)) || v.by_index()),
                "dispatch-list-N and the index variants list children: they need --children"
            );
        }
        anyhow::ensure!(
            namespaces == 1 || !self.variants.contains(&Variant::KubeRsMetadata),
            "kube-rs-metadata watches one namespace: leave it out of --variants with --namespaces {namespaces}"
        );
        let wants_controller_runtime = self.variants.iter().any(|v| {
            matches!(
                v,
                Variant::ControllerRuntime
                    | Variant::ControllerRuntimeMetadata
                    | Variant::ControllerRuntimeIndex
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
            .any(|v| matches!(v, Variant::GoDispatch(_) | Variant::GoDispatchIndex(_)));
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
pub(crate) struct SecurityArgs {
    /// Runs of each mode (security off, on), alternating; tables show medians.
    #[arg(long, env = "KD_BENCH_REPEATS", default_value_t = 3, value_parser = positive())]
    pub(crate) repeats: usize,

    /// Writes timed per run, one at a time.
    #[arg(long, env = "KD_BENCH_WRITES", default_value_t = 200, value_parser = positive())]
    pub(crate) writes: usize,

    /// Sessions opened and timed per run, each in a group of its own (at least 2: the first
    /// is shown apart).
    #[arg(long, env = "KD_BENCH_SECURITY_OPENS", default_value_t = 50)]
    pub(crate) opens: usize,

    /// Sessions polling in the review window.
    #[arg(long, env = "KD_BENCH_SECURITY_SESSIONS", default_value_t = 1_000, value_parser = positive())]
    pub(crate) sessions: usize,

    /// ServiceAccounts those sessions belong to.
    #[arg(long, env = "KD_BENCH_SECURITY_IDENTITIES", default_value_t = 10, value_parser = positive())]
    pub(crate) identities: usize,

    /// How long the sessions poll; longer than the 2-minute review caches, so their renewal
    /// is counted.
    #[arg(long, env = "KD_BENCH_SECURITY_WINDOW", value_parser = humantime::parse_duration, default_value = "150s")]
    pub(crate) window: Duration,

    /// Where the results go.
    #[command(flatten)]
    pub(crate) output: Output,
}
