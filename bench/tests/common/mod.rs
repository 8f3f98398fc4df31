//! What the benchmark smoke tests share: running the harness against the shared control plane,
//! and reading the figures it writes as JSON. Each smoke test is a binary of its own (the API server's
//! request counts are global), so not every one uses every helper.
#![allow(dead_code)]

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use serde_json::Value;

/// A finished harness run.
pub(crate) struct Run {
    /// Its scratch folder (`BENCHMARKS.md`, `results.json`, `plots/`, `logs/`).
    pub(crate) out: PathBuf,
    /// What it wrote into `BENCHMARKS.md`.
    pub(crate) results: String,
    /// The figures it wrote with `--json`.
    pub(crate) json: Value,
    /// What it printed.
    pub(crate) stdout: String,
}

impl Drop for Run {
    /// Removes the scratch folder, unless the test failed: then it is kept, and what the
    /// processes logged about their watches and rings is printed, so a failure seen once in CI
    /// (a request count off by one, say) can be explained from its output alone.
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "smoke run failed: its folder is kept at {}",
                self.out.display()
            );
            print_watch_logs(&self.out.join("logs"));
            return;
        }
        let _ = std::fs::remove_dir_all(&self.out);
    }
}

/// The log files of every process under `dir`, sorted.
fn log_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_owned()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "log") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// Whether a process of `run` logged a line containing `text`.
pub(crate) fn logged(run: &Run, text: &str) -> bool {
    log_files(&run.out.join("logs"))
        .iter()
        .any(|file| std::fs::read_to_string(file).is_ok_and(|log| log.contains(text)))
}

/// Prints the log lines of every process under `dir` that speak of watches, lists, rings and
/// Leases (at most 80 a process).
fn print_watch_logs(dir: &Path) {
    for file in log_files(dir) {
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        eprintln!("--- {}", file.display());
        let about = [
            "watch",
            "list",
            "ring",
            "namespaces owned",
            "handover",
            "judged dead",
            "dispatcher Lease",
        ];
        for line in text
            .lines()
            .filter(|l| about.iter().any(|a| l.contains(a)))
            .take(80)
        {
            eprintln!("{line}");
        }
    }
}

/// The folder of the test build's binaries (the dispatcher, the load balancer, the benchmark
/// controller).
pub(crate) fn bin_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_bench-controller"))
        .parent()
        .expect("binaries live in a directory")
        .to_owned()
}

/// The subcommands of `kube-dispatch-bench` the smoke tests run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    Compare,
    Metrics,
    Ceiling,
    Shards,
    Daily,
}

impl Mode {
    fn subcommand(self) -> &'static str {
        match self {
            Mode::Compare => "compare",
            Mode::Metrics => "metrics",
            Mode::Ceiling => "ceiling",
            Mode::Shards => "shards",
            Mode::Daily => "daily",
        }
    }
}

/// Runs `kube-dispatch-bench <mode>` with `args` against the shared control plane, with the
/// test build's binaries and a scratch folder named after `name` for its results (Markdown and
/// JSON), plots and logs; panics with its output if it fails.
pub(crate) fn run_harness(name: &str, mode: Mode, args: &[&str]) -> Run {
    let cluster = kube_dispatch_tests::Cluster::shared();
    let out = std::env::temp_dir().join(format!("kd-bench-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&out).expect("a scratch folder");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut command = Command::new(env!("CARGO_BIN_EXE_kube-dispatch-bench"));
    command
        .current_dir(&root)
        .env("KUBECONFIG", cluster.kubeconfig())
        .arg(mode.subcommand())
        .args(args)
        .arg("--out")
        .arg(out.join("BENCHMARKS.md"))
        .arg("--json")
        .arg(out.join("results.json"));
    // The metrics benchmark runs in the harness's process: no binaries, no logs.
    if mode != Mode::Metrics {
        command
            .arg("--bin-dir")
            .arg(bin_dir())
            .arg("--logs")
            .arg(out.join("logs"));
    }
    if mode == Mode::Compare {
        command.arg("--plots-dir").arg(out.join("plots"));
    }
    let output = command.output().expect("the harness runs");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "the harness failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let results = std::fs::read_to_string(out.join("BENCHMARKS.md")).expect("results written");
    let json = std::fs::read_to_string(out.join("results.json")).expect("figures written");
    let json = serde_json::from_str(&json)
        .unwrap_or_else(|e| panic!("the figures are not JSON ({e}):\n{json}"));
    Run {
        out,
        results,
        json,
        stdout,
    }
}

/// A number of the JSON at `pointer` (`/scenarios/0/objects`, say); panics if there is none
/// (a `null`, where a table shows `–`, included).
pub(crate) fn number(json: &Value, pointer: &str) -> f64 {
    json.pointer(pointer)
        .and_then(Value::as_f64)
        .unwrap_or_else(|| panic!("no number at {pointer} in:\n{json:#}"))
}

/// The scenario of `compare --json` on `kinds` (their `--kinds` values) and `objects` objects.
pub(crate) fn scenario<'a>(json: &'a Value, kinds: &[&str], objects: usize) -> &'a Value {
    json["scenarios"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|s| s["kinds"] == Value::from(kinds) && s["objects"] == objects)
        .unwrap_or_else(|| panic!("no scenario of {kinds:?} at {objects} objects in:\n{json:#}"))
}

/// The figure `key` (a row's key: `reconciles`, `requests_watch`, ...) of `variant` in a
/// scenario of `compare --json`.
pub(crate) fn figure(scenario: &Value, variant: &str, key: &str) -> f64 {
    number(scenario, &format!("/figures/{variant}/{key}"))
}

/// The harness arguments of a run of two controllers as two kube-rs processes and as two groups
/// on one tier, one run each with 6 timed writes (`--kinds`, `--objects` and `--section` left
/// to add).
pub(crate) const TWO_CONTROLLERS: [&str; 12] = [
    "--groups",
    "2",
    "--variants",
    "kube-rs,dispatch-1",
    "--repeats",
    "1",
    "--writes",
    "6",
    "--write-interval",
    "10ms",
    "--command",
    "groups smoke test",
];

/// What a run of two controllers ([`TWO_CONTROLLERS`] `--variants kube-rs,dispatch-1`) on a
/// tier of 3 dispatchers must show: both variants reconciled each of the `objects` objects once
/// per controller at least, two kube-rs controllers watched twice, and the tier watched once per
/// dispatcher, whatever the number of controllers.
pub(crate) fn assert_two_controllers_reconciled_and_the_tier_watched_once(
    run: &Run,
    objects: usize,
) {
    let scenario = &run.json["scenarios"][0];
    for variant in ["kube-rs", "dispatch-1"] {
        let reconciles = figure(scenario, variant, "reconciles");
        assert!(
            reconciles >= (2 * objects) as f64,
            "{variant}: {reconciles} reconciles for 2 controllers of {objects} objects"
        );
    }
    let watches = |variant| figure(scenario, variant, "requests_watch");
    assert_eq!(watches("kube-rs"), 2.0, "{:#}", run.json);
    assert_eq!(watches("dispatch-1"), 3.0, "{:#}", run.json);
}

/// Runs [`TWO_CONTROLLERS`] on `objects` objects spread over `namespaces` namespaces, with the
/// ring keyed by namespace, into the section `section`; `kinds` are the `--kinds` arguments
/// (and `--mix` if wanted).
pub(crate) fn run_two_controllers_over_namespaces(
    section: &str,
    kinds: &[&str],
    objects: usize,
    namespaces: usize,
) -> Run {
    let (objects, namespaces) = (objects.to_string(), namespaces.to_string());
    let spread = [
        "--objects",
        &objects,
        "--namespaces",
        &namespaces,
        "--ring-key",
        "namespace",
        "--section",
        section,
    ];
    run_harness(
        section,
        Mode::Compare,
        &[kinds, &spread, &TWO_CONTROLLERS].concat(),
    )
}

/// The controller-runtime incumbent (or, with `dispatch`, its port to the Go SDK), built with
/// the machine's Go as `make bench` builds it: its path.
pub(crate) fn controller_runtime(dispatch: bool) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut build = Command::new(root.join("bench/controller-runtime/build.sh"));
    if dispatch {
        build.arg("dispatch");
    }
    let built = build
        .output()
        .expect("the controller-runtime build script runs");
    assert!(
        built.status.success(),
        "building the controller-runtime {} failed:\n{}",
        if dispatch {
            "port to the Go SDK"
        } else {
            "incumbent"
        },
        String::from_utf8_lossy(&built.stderr)
    );
    String::from_utf8(built.stdout)
        .expect("a path")
        .trim()
        .to_owned()
}
