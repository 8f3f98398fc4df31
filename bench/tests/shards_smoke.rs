//! `make bench-shards` at a tiny scale against the real control plane: with the ring keyed by
//! name every dispatcher decodes the objects the others own; keyed by namespace, the API server
//! sends each only its own (`shardSelector`), and every object is still reconciled. A test
//! binary of its own, as `ceiling_smoke.rs` is: the API server's request counts are global.

use std::{path::Path, process::Command};

/// The cells of the row of the table whose label is `label`, as numbers.
fn row(results: &str, label: &str) -> Vec<f64> {
    results
        .lines()
        .find(|l| l.starts_with(&format!("| {label} |")))
        .unwrap_or_else(|| panic!("no row {label:?} in:\n{results}"))
        .split('|')
        .map(|c| c.trim().trim_end_matches('×'))
        .filter_map(|c| c.parse().ok())
        .collect()
}

#[test]
fn the_sharding_benchmark_shows_each_dispatcher_receiving_its_own_namespaces_only() {
    let cluster = kube_dispatch_tests::Cluster::shared();
    let controller = Path::new(env!("CARGO_BIN_EXE_bench-controller"));
    let bin_dir = controller.parent().expect("binaries live in a directory");
    let out = std::env::temp_dir().join(format!("kd-bench-shards-{}", std::process::id()));
    std::fs::create_dir_all(&out).expect("a scratch folder");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let output = Command::new(env!("CARGO_BIN_EXE_kube-dispatch-bench"))
        .current_dir(&root)
        .env("KUBECONFIG", cluster.kubeconfig())
        .args(["--shards", "--shard-namespaces", "12", "--objects", "3"])
        .args([
            "--dispatchers",
            "3",
            "--writes",
            "24",
            "--write-interval",
            "10ms",
        ])
        .arg("--bin-dir")
        .arg(bin_dir)
        .arg("--out")
        .arg(out.join("BENCHMARKS.md"))
        .arg("--logs")
        .arg(out.join("logs"))
        .args(["--command", "shards smoke test"])
        .output()
        .expect("the harness runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the harness failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let results = std::fs::read_to_string(out.join("BENCHMARKS.md")).expect("results written");
    assert!(results.contains("<!-- bench:shards:begin -->\nProduced by `shards smoke test`"));
    // Keyed by name, each of the 3 dispatchers lists all 36 objects and keeps its third.
    let decoded = row(&results, "cold start: objects decoded by all dispatchers");
    let elsewhere = row(&results, "cold start: of them owned by another dispatcher");
    assert!(decoded[0] >= 3.0 * 36.0, "keyed by name: {decoded:?}");
    assert!(elsewhere[0] >= 2.0 * 36.0, "keyed by name: {elsewhere:?}");
    // Keyed by namespace, each is sent its own namespaces' objects only.
    assert!(
        (36.0..3.0 * 36.0).contains(&decoded[1]),
        "keyed by namespace: {decoded:?}"
    );
    assert_eq!(elsewhere[1], 0.0, "keyed by namespace: {elsewhere:?}");
    let _ = std::fs::remove_dir_all(out);
}
