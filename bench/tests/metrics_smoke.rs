//! `make bench-metrics` at a tiny scale against the real control plane: both modes run and
//! the results are written. A test binary of its own: the API server's request counts that
//! `smoke.rs` checks are global, and this run's LISTs would fall into them.

mod common;

use common::run_harness;

#[test]
fn the_metrics_benchmark_runs_both_modes_and_writes_its_section() {
    let run = run_harness(
        "metrics",
        &[
            "--metrics",
            "--objects",
            "40",
            "--repeats",
            "1",
            "--command",
            "metrics smoke test",
        ],
    );
    let (results, stdout) = (&run.results, &run.stdout);
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
}
