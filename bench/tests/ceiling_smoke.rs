//! `make bench-ceiling` at a tiny scale against the real control plane: the dispatcher counts
//! the events of every write, every write is reconciled, and the results are written. A test
//! binary of its own, as `metrics_smoke.rs` is: the API server's request counts that
//! `smoke.rs` checks are global.

mod common;

use common::{Mode, number, run_harness};

#[test]
fn the_ceiling_benchmark_counts_the_events_of_its_writes_and_writes_its_section() {
    let run = run_harness(
        "ceiling",
        Mode::Ceiling,
        &[
            "--objects",
            "30",
            "--rates",
            "20,40",
            "--window",
            "1s",
            "--command",
            "ceiling smoke test",
        ],
    );
    let results = &run.results;
    assert!(results.contains("<!-- bench:ceiling:begin -->\nProduced by `ceiling smoke test`"));
    for rate in [20_u64, 40] {
        let step = run.json["steps"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|s| s["target"] == rate)
            .unwrap_or_else(|| panic!("no step at {rate} writes/s in:\n{:#}", run.json));
        // Whole numbers, as the table shows them and as these bounds were set against.
        let per_s = |key: &str| number(step, &format!("/{key}")).round();
        let (achieved, patches, events) = (
            per_s("achieved"),
            per_s("patches_per_s"),
            per_s("events_per_s"),
        );
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
