//! `make bench-ceiling` at a tiny scale against the real control plane: the dispatcher counts
//! the events of every write, every write is reconciled, and the results are written. A test
//! binary of its own, as `metrics_smoke.rs` is: the API server's request counts that
//! `smoke.rs` checks are global.

mod common;

use common::run_harness;

#[test]
fn the_ceiling_benchmark_counts_the_events_of_its_writes_and_writes_its_section() {
    let run = run_harness(
        "ceiling",
        &[
            "--ceiling",
            "--objects",
            "30",
            "--ceiling-rates",
            "20,40",
            "--ceiling-window",
            "1s",
            "--command",
            "ceiling smoke test",
        ],
    );
    let results = &run.results;
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
}
