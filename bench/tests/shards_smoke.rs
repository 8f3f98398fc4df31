//! `make bench-shards` at a tiny scale against the real control plane: with the ring keyed by
//! name every dispatcher decodes the objects the others own; keyed by namespace, the API server
//! sends each only its own (`shardSelector`) where it has the `ShardedListAndWatch` gate on
//! (1.36 and newer), and every object is still reconciled either way. A test
//! binary of its own, as `ceiling_smoke.rs` is: the API server's request counts are global.

mod common;

use common::{Mode, run_harness};

#[test]
fn the_sharding_benchmark_shows_each_dispatcher_receiving_its_own_namespaces_only() {
    let run = run_harness(
        "shards",
        Mode::Shards,
        &[
            "--namespaces",
            "12",
            "--objects",
            "3",
            "--dispatchers",
            "3",
            "--writes",
            "24",
            "--write-interval",
            "10ms",
            "--command",
            "shards smoke test",
        ],
    );
    let (results, json) = (&run.results, &run.json);
    assert!(results.contains("<!-- bench:shards:begin -->\nProduced by `shards smoke test`"));
    // A figure of the cold start summed over the dispatchers of the ring keyed by `ring` (as
    // the table's "by all dispatchers" rows sum it).
    let all = |ring: &str, figure: &str| -> f64 {
        let outcome = json["outcomes"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|o| o["variant"] == ring)
            .unwrap_or_else(|| panic!("no outcome of the {ring} in:\n{json:#}"));
        let dispatchers = outcome["cold"]["dispatchers"]
            .as_array()
            .filter(|d| !d.is_empty())
            .unwrap_or_else(|| panic!("no dispatchers in the {ring}:\n{json:#}"));
        dispatchers
            .iter()
            .map(|d| {
                d[figure]
                    .as_f64()
                    .unwrap_or_else(|| panic!("no {figure} in {d}"))
            })
            .sum()
    };
    let decoded = |ring: &str| all(ring, "events");
    let elsewhere = |ring: &str| all(ring, "elsewhere");
    // Keyed by name, each of the 3 dispatchers lists all 36 objects and keeps its third.
    let (by_name, by_namespace) = ("ring keyed by name", "ring keyed by namespace");
    assert!(decoded(by_name) >= 3.0 * 36.0, "keyed by name: {json:#}");
    assert!(elsewhere(by_name) >= 2.0 * 36.0, "keyed by name: {json:#}");
    let sharded = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(kube_dispatch_tests::Cluster::shared().shards_lists_and_watches())
        .expect("the API server's feature gates");
    if sharded {
        // Keyed by namespace, each is sent its own namespaces' objects only.
        assert!(
            (36.0..3.0 * 36.0).contains(&decoded(by_namespace)),
            "keyed by namespace: {json:#}"
        );
        assert_eq!(elsewhere(by_namespace), 0.0, "keyed by namespace: {json:#}");
    } else {
        // A server without the gate ignores shardSelector: each is sent everything, as keyed
        // by name, and drops what the others own.
        assert!(
            decoded(by_namespace) >= 3.0 * 36.0,
            "keyed by namespace: {json:#}"
        );
        assert!(
            elsewhere(by_namespace) >= 2.0 * 36.0,
            "keyed by namespace: {json:#}"
        );
    }
}
