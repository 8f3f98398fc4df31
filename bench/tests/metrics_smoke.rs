//! `make bench-metrics` at a tiny scale against the real control plane: both modes run and
//! the results are written. A test binary of its own: the API server's request counts that
//! `smoke.rs` checks are global, and this run's LISTs would fall into them.

mod common;

use common::{Mode, run_harness};

#[test]
fn the_metrics_benchmark_runs_both_modes_and_writes_its_section() {
    let run = run_harness(
        "metrics",
        Mode::Metrics,
        &[
            "--objects",
            "40",
            "--repeats",
            "1",
            "--command",
            "metrics smoke test",
        ],
    );
    let (results, json) = (&run.results, &run.json);
    assert!(results.contains("<!-- bench:metrics:begin -->\nProduced by `metrics smoke test`"));
    // The median throughput of each mode (none: no throughput).
    let throughput = |mode: &str| json[mode]["throughput"].as_f64().unwrap_or(0.0);
    assert!(
        throughput("off") > 0.0 && throughput("on") > 0.0,
        "{json:#}"
    );
    // With metrics on, both processes were scraped while the run went on.
    let scrapes = json["on"]["scrapes_per_run"]
        .as_array()
        .filter(|runs| !runs.is_empty())
        .unwrap_or_else(|| panic!("no run with metrics on:\n{json:#}"));
    assert!(
        scrapes.iter().all(|n| n.as_u64().is_some_and(|n| n > 0)),
        "{json:#}"
    );
}
