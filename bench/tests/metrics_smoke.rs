//! `make bench-metrics` at a tiny scale against the real control plane: both modes run and
//! the results are written. A test binary of its own: the API server's request counts that
//! `smoke.rs` checks are global, and this run's LISTs would fall into them.

use std::{path::Path, process::Command};

#[test]
fn the_metrics_benchmark_runs_both_modes_and_writes_its_section() {
    let cluster = kube_dispatch_tests::Cluster::shared();
    let out = std::env::temp_dir().join(format!("kd-bench-metrics-{}", std::process::id()));
    std::fs::create_dir_all(&out).expect("a scratch folder");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let output = Command::new(env!("CARGO_BIN_EXE_kube-dispatch-bench"))
        .current_dir(&root)
        .env("KUBECONFIG", cluster.kubeconfig())
        .args(["--metrics", "--objects", "40", "--repeats", "1"])
        .arg("--out")
        .arg(out.join("BENCHMARKS.md"))
        .args(["--command", "metrics smoke test"])
        .output()
        .expect("the harness runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the harness failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let results = std::fs::read_to_string(out.join("BENCHMARKS.md")).expect("results written");
    assert!(results.contains("<!-- bench:metrics:begin -->\nProduced by `metrics smoke test`"));
    let throughput = |mode: &str| -> f64 {
        let row = results
            .lines()
            .find(|l| l.starts_with("| throughput, reconciles/s |"))
            .unwrap_or_else(|| panic!("no throughput row in:\n{results}"));
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let column = if mode == "off" { 2 } else { 3 };
        cells[column].parse().unwrap_or(0.0)
    };
    assert!(
        throughput("off") > 0.0 && throughput("on") > 0.0,
        "{results}"
    );
    // With metrics on, both processes were scraped while the run went on.
    let on = stdout
        .lines()
        .find(|l| l.contains("metrics on "))
        .unwrap_or_else(|| panic!("no run with metrics on:\n{stdout}"));
    assert!(!on.ends_with(" 0 scrapes"), "{on}");
    let _ = std::fs::remove_dir_all(out);
}
