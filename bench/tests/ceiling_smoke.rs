//! `make bench-ceiling` at a tiny scale against the real control plane: the dispatcher counts
//! the events of every write, every write is reconciled, and the results are written. A test
//! binary of its own, as `metrics_smoke.rs` is: the API server's request counts that
//! `smoke.rs` checks are global.

use std::{path::Path, process::Command};

#[test]
fn the_ceiling_benchmark_counts_the_events_of_its_writes_and_writes_its_section() {
    let cluster = kube_dispatch_tests::Cluster::shared();
    let controller = Path::new(env!("CARGO_BIN_EXE_bench-controller"));
    let bin_dir = controller.parent().expect("binaries live in a directory");
    let out = std::env::temp_dir().join(format!("kd-bench-ceiling-{}", std::process::id()));
    std::fs::create_dir_all(&out).expect("a scratch folder");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let output = Command::new(env!("CARGO_BIN_EXE_kube-dispatch-bench"))
        .current_dir(&root)
        .env("KUBECONFIG", cluster.kubeconfig())
        .args(["--ceiling", "--objects", "30"])
        .args(["--ceiling-rates", "20,40", "--ceiling-window", "1s"])
        .arg("--bin-dir")
        .arg(bin_dir)
        .arg("--out")
        .arg(out.join("BENCHMARKS.md"))
        .arg("--logs")
        .arg(out.join("logs"))
        .args(["--command", "ceiling smoke test"])
        .output()
        .expect("the harness runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the harness failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let results = std::fs::read_to_string(out.join("BENCHMARKS.md")).expect("results written");
    assert!(results.contains("<!-- bench:ceiling:begin -->\nProduced by `ceiling smoke test`"));
    for rate in ["20", "40"] {
        let cells: Vec<f64> = results
            .lines()
            .find(|l| l.starts_with(&format!("| {rate} |")))
            .unwrap_or_else(|| panic!("no row for {rate} writes/s in:\n{results}"))
            .split('|')
            .map(str::trim)
            .filter_map(|c| c.parse().ok())
            .collect();
        let (achieved, patches, events) = (cells[1], cells[2], cells[3]);
        assert!(achieved > 0.0, "{rate}: no write made it");
        // Every write and every reconcile's own write is a change the watch shows: the
        // dispatcher counts as many events as the API server counts patches (a no-op patch, a
        // reconcile seeing a hash already written, is the only allowed difference).
        assert!(
            events >= achieved && events <= patches + 1.0,
            "{rate}: {events} events/s for {achieved} writes/s and {patches} patches/s"
        );
    }
    let _ = std::fs::remove_dir_all(out);
}
