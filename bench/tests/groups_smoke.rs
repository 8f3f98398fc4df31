//! `make bench-groups` at a tiny scale against the real control plane: two distinct
//! controllers as two kube-rs processes and as two groups on one tier both reconcile every
//! object, and the tier's requests to the API server do not grow with the controllers. A test
//! binary of its own, as `metrics_smoke.rs` is: the API server's request counts are global.

use std::{path::Path, process::Command};

const OBJECTS: usize = 20;

/// The cells of the row `label` of the table in `results`, by column header.
fn row(results: &str, label: &str) -> Vec<(String, String)> {
    let header = results
        .lines()
        .find(|l| l.starts_with("| figure |"))
        .unwrap_or_else(|| panic!("no table in:\n{results}"));
    let cells = results
        .lines()
        .find(|l| l.starts_with(&format!("| {label} |")))
        .unwrap_or_else(|| panic!("no row {label:?} in:\n{results}"));
    let split = |l: &str| -> Vec<String> {
        l.split('|')
            .map(|c| c.trim().to_owned())
            .filter(|c| !c.is_empty())
            .collect()
    };
    split(header).into_iter().zip(split(cells)).collect()
}

fn figure(results: &str, label: &str, variant: &str) -> f64 {
    row(results, label)
        .into_iter()
        .find(|(column, _)| column == variant)
        .and_then(|(_, value)| value.parse().ok())
        .unwrap_or_else(|| panic!("no figure for {variant} in row {label:?}:\n{results}"))
}

#[test]
fn two_controllers_reconcile_everything_and_the_tier_watches_once() {
    let cluster = kube_dispatch_tests::Cluster::shared();
    let controller = Path::new(env!("CARGO_BIN_EXE_bench-controller"));
    let bin_dir = controller.parent().expect("binaries live in a directory");
    let out = std::env::temp_dir().join(format!("kd-bench-groups-{}", std::process::id()));
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let output = Command::new(env!("CARGO_BIN_EXE_kube-dispatch-bench"))
        .current_dir(&root)
        .env("KUBECONFIG", cluster.kubeconfig())
        .args(["--objects", &OBJECTS.to_string(), "--kinds", "config-map"])
        .args(["--groups", "2", "--variants", "kube-rs,dispatch-1"])
        .args([
            "--repeats",
            "1",
            "--writes",
            "5",
            "--write-interval",
            "10ms",
        ])
        .arg("--bin-dir")
        .arg(bin_dir)
        .arg("--out")
        .arg(out.join("BENCHMARKS.md"))
        .arg("--plots-dir")
        .arg(out.join("plots"))
        .arg("--logs")
        .arg(out.join("logs"))
        .args(["--section", "groups", "--command", "groups smoke test"])
        .output()
        .expect("the harness runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the harness failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let results = std::fs::read_to_string(out.join("BENCHMARKS.md")).expect("results written");
    assert!(results.contains("<!-- bench:groups:begin -->"));
    assert!(
        results.contains(&format!(
            "#### ConfigMaps, {OBJECTS} objects, 2 controllers"
        )),
        "{results}"
    );
    for variant in ["kube-rs", "dispatch-1"] {
        // Each controller reconciled every object at least once.
        let reconciles = figure(&results, "reconciles started", variant);
        assert!(
            reconciles >= (2 * OBJECTS) as f64,
            "{variant}: {reconciles} reconciles for 2 controllers of {OBJECTS} objects"
        );
    }
    // Two kube-rs controllers watch twice; the tier watches once per dispatcher, whatever
    // the number of controllers (3 dispatchers).
    assert_eq!(
        figure(&results, "API requests on the resource: WATCH", "kube-rs"),
        2.0
    );
    assert_eq!(
        figure(
            &results,
            "API requests on the resource: WATCH",
            "dispatch-1"
        ),
        3.0
    );
    let _ = std::fs::remove_dir_all(out);
}
